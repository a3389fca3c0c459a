"""NetworkPolicy objects into the model: read strictly (``parse_network_policy``:
manifests, and the controller's published form), or failing closed
(``read_network_policy``: policies the API server accepted, whose parts sluice
cannot read are refused the safe way rather than dropped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.fields import FieldReader
from cni.policy.model import (
    EVERYTHING,
    IPBlock,
    NetworkPolicy,
    Peer,
    PolicyPort,
    PolicyRule,
)

POLICY_TYPES = ("Ingress", "Egress")


def _ip_block(reader: FieldReader, value: object, path: str) -> IPBlock:
    block = reader.mapping(value, path)
    if block.get("cidr") is None:
        reader.fail(f"{path}.cidr", MISSING, "is required")
    network = reader.cidr(block["cidr"], f"{path}.cidr")
    excepts = []
    for i, text in enumerate(reader.items(block.get("except"), f"{path}.except")):
        at = f"{path}.except[{i}]"
        excepted = reader.cidr(text, at)
        # The API server's rule: a strict subset of cidr.
        inside = (
            excepted.version == network.version
            and excepted.network_address in network
            and excepted.prefixlen > network.prefixlen
        )
        if not inside:
            reader.fail(at, text, f"is not inside cidr {network} (it must be a strict subset)")
        excepts.append(str(excepted))
    return IPBlock(str(network), tuple(excepts))


def _peer(reader: FieldReader, value: object, path: str) -> Peer:
    spec = reader.mapping(value, path)
    pod_selector = spec.get("podSelector")
    namespace_selector = spec.get("namespaceSelector")
    ip_block = spec.get("ipBlock")
    if ip_block is not None and (pod_selector is not None or namespace_selector is not None):
        reader.fail(path, spec, "may not combine ipBlock with podSelector or namespaceSelector")
    if ip_block is None and pod_selector is None and namespace_selector is None:
        reader.fail(path, spec, "must set podSelector, namespaceSelector or ipBlock")
    return Peer(
        pod_selector=None
        if pod_selector is None
        else reader.selector(pod_selector, f"{path}.podSelector"),
        namespace_selector=None
        if namespace_selector is None
        else reader.selector(namespace_selector, f"{path}.namespaceSelector"),
        ip_block=None if ip_block is None else _ip_block(reader, ip_block, f"{path}.ipBlock"),
    )


def _policy_port(reader: FieldReader, value: object, path: str) -> PolicyPort:
    spec = reader.mapping(value, path)
    protocol = reader.protocol(spec.get("protocol"), f"{path}.protocol")
    port = spec.get("port")
    end_port = spec.get("endPort")
    if isinstance(port, str):
        port = reader.port_name(port, f"{path}.port")
    elif port is not None:
        port = reader.integer(port, f"{path}.port", 1, 65535)
    if end_port is not None:
        end_port = reader.integer(end_port, f"{path}.endPort", 1, 65535)
        if not isinstance(port, int):
            reader.fail(f"{path}.endPort", end_port, "needs a numeric port")
        if end_port < port:
            reader.fail(f"{path}.endPort", end_port, f"is lower than port {port}")
    return PolicyPort(protocol, port, end_port)


def _rule(reader: FieldReader, value: object, at: str, peers_field: str) -> PolicyRule:
    rule = reader.mapping(value, at)
    peers = reader.items(rule.get(peers_field), f"{at}.{peers_field}")
    ports = reader.items(rule.get("ports"), f"{at}.ports")
    return PolicyRule(
        peers=tuple(_peer(reader, p, f"{at}.{peers_field}[{j}]") for j, p in enumerate(peers)),
        ports=tuple(_policy_port(reader, p, f"{at}.ports[{j}]") for j, p in enumerate(ports)),
    )


def _rules(
    reader: FieldReader, value: object, path: str, peers_field: str, published: bool
) -> tuple[PolicyRule, ...]:
    rules = []
    for i, rule in enumerate(reader.items(value, path)):
        if published and isinstance(rule, Mapping) and "refused" in rule:
            rules.append(PolicyRule(refused=reader.string(rule["refused"], f"{path}[{i}].refused")))
        else:
            rules.append(_rule(reader, rule, f"{path}[{i}]", peers_field))
    return tuple(rules)


def _policy_types(reader: FieldReader, spec: Mapping[str, Any]) -> tuple[str, ...]:
    types = reader.items(spec.get("policyTypes"), "spec.policyTypes")
    for i, policy_type in enumerate(types):
        if policy_type not in POLICY_TYPES:
            reader.fail(f"spec.policyTypes[{i}]", policy_type, "is not one of Ingress, Egress")
    return tuple(t for t in POLICY_TYPES if t in types)


def parse_network_policy(obj: Mapping[str, Any], *, published: bool = False) -> NetworkPolicy:
    """A NetworkPolicy read strictly: any field sluice cannot read is an error (for
    manifests, refused whole). ``published``: the form the controller publishes, whose
    rules may say they were refused (``render.policy_spec_json``)."""
    reader = FieldReader("NetworkPolicy")
    reader.api_version(reader.mapping(obj, ""))
    namespace, name = reader.metadata(obj, namespaced=True)
    spec = reader.mapping(obj.get("spec"), "spec")
    refusals: tuple[str, ...] = ()
    if published:
        listed = reader.items(spec.get("refusals"), "spec.refusals")
        refusals = tuple(reader.string(r, f"spec.refusals[{i}]") for i, r in enumerate(listed))
    return NetworkPolicy(
        namespace=namespace,
        name=name,
        pod_selector=reader.selector(spec.get("podSelector"), "spec.podSelector"),
        policy_types=_policy_types(reader, spec),
        ingress=_rules(reader, spec.get("ingress"), "spec.ingress", "from", published),
        egress=_rules(reader, spec.get("egress"), "spec.egress", "to", published),
        refusals=refusals,
    )


def read_network_policy(obj: Mapping[str, Any]) -> NetworkPolicy:
    """A NetworkPolicy the API server accepted, read failing closed: what sluice cannot
    read is refused, not dropped, each part the safe way (an unreadable rule allows
    nothing; an unreadable podSelector selects every pod of the namespace; unreadable
    policyTypes isolate both directions), and listed in ``refusals``. Only a policy
    whose namespace and name cannot be read raises PolicyInputError."""
    try:
        return parse_network_policy(obj)
    except PolicyInputError:
        pass
    reader = FieldReader("NetworkPolicy")
    namespace, name = reader.metadata(reader.mapping(obj, ""), namespaced=True)
    refusals: list[str] = []

    def refused(err: PolicyInputError) -> str:
        why = str(err).removeprefix(f"{err.obj}: ")
        refusals.append(why)
        return why

    try:
        spec = reader.mapping(obj.get("spec"), "spec")
    except PolicyInputError as err:
        refused(err)
        spec = {}
    try:
        pod_selector = reader.selector(spec.get("podSelector"), "spec.podSelector")
    except PolicyInputError as err:
        refused(err)
        pod_selector = EVERYTHING
    try:
        policy_types = _policy_types(reader, spec)
    except PolicyInputError as err:
        refused(err)
        policy_types = POLICY_TYPES

    def rules(field: str, peers_field: str) -> tuple[PolicyRule, ...]:
        path = f"spec.{field}"
        try:
            listed = reader.items(spec.get(field), path)
        except PolicyInputError as err:
            return (PolicyRule(refused=refused(err)),)  # isolates, allows nothing
        out = []
        for i, rule in enumerate(listed):
            try:
                out.append(_rule(reader, rule, f"{path}[{i}]", peers_field))
            except PolicyInputError as err:
                out.append(PolicyRule(refused=refused(err)))
        return tuple(out)

    return NetworkPolicy(
        namespace=namespace,
        name=name,
        pod_selector=pod_selector,
        policy_types=policy_types,
        ingress=rules("ingress", "from"),
        egress=rules("egress", "to"),
        refusals=tuple(refusals),
    )
