"""Kubernetes objects (API JSON or manifest YAML, as dicts) into the resolver's model.

Only the fields the resolver reads are kept. Validation follows the API
server's, so a manifest the API server would refuse is refused here too, and
every error names the object, the field path and the value:
``NetworkPolicy x/deny: spec.ingress[0].ports[1].endPort 70 is lower than port 80``.

Conventions of the local store, as the API server has them:
- a Namespace always carries ``kubernetes.io/metadata.name: <its name>``;
- an object without ``metadata.namespace`` is in ``default``;
- a Pod may carry ``status.podIPs``/``status.podIP`` (a remote pod) or no
  address yet (a local pod, addressed later by the agent);
- a Pod in phase Succeeded or Failed has no address: its address may already
  belong to another pod.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from cni.policy.addresses import MAPPED_REFUSAL, IPNetwork, legacy_cidr, legacy_ip
from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.model import (
    EVERYTHING,
    NAMESPACE_NAME_LABEL,
    OPERATORS,
    PROTOCOLS,
    ContainerPort,
    IPBlock,
    KubeObject,
    Labels,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyPort,
    PolicyRule,
    Requirement,
    Service,
    ServicePort,
    labels_of,
)

API_VERSIONS = {
    "Namespace": "v1",
    "Pod": "v1",
    "Service": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
POLICY_TYPES = ("Ingress", "Egress")
TERMINATED_PHASES = ("Succeeded", "Failed")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class _Reader:
    """Reads one object's fields; every error names the object and the field path."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.what = kind

    def fail(self, path: str, value: object, problem: str) -> NoReturn:
        raise PolicyInputError(self.what, path, value, problem)

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, value, "must be an object")
        return value

    def items(self, value: object, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, value, "must be a list")
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, MISSING if value is None else value, "must be a string")
        return value

    def integer(self, value: object, path: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, value, "must be an integer")
        if not low <= value <= high:
            self.fail(path, value, f"is not between {low} and {high}")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            self.fail(path, value, "must be true or false")
        return value

    def metadata(self, obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str]:
        """(namespace, name), and from here on errors name the object."""
        meta = self.mapping(obj.get("metadata"), "metadata")
        name = meta.get("name")
        if name is None:
            self.fail("metadata.name", MISSING, "is required")
        self.string(name, "metadata.name")
        namespace = ""
        if namespaced:
            namespace = self.string(meta.get("namespace") or "default", "metadata.namespace")
            self.what = f"{self.kind} {namespace}/{name}"
            self.dns_name(namespace, "metadata.namespace", label=True)
            self.dns_name(name, "metadata.name", label=False)
        else:
            self.what = f"{self.kind} {name}"
            self.dns_name(name, "metadata.name", label=True)
        return sys.intern(namespace), name

    def dns_name(self, value: str, path: str, label: bool) -> None:
        pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
        if len(value) > limit or not pattern.fullmatch(value):
            self.fail(
                path,
                value,
                f"is not a valid name: at most {limit} lower-case letters, digits, '-'"
                + ("" if label else " and '.'")
                + ", starting and ending with a letter or digit",
            )

    def label_key(self, value: object, path: str) -> str:
        key = self.string(value, path)
        parts = key.split("/")
        name = parts[-1]
        bad_prefix = len(parts) > 2 or (
            len(parts) == 2 and (len(parts[0]) > 253 or not _DNS_SUBDOMAIN.fullmatch(parts[0]))
        )
        if bad_prefix or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
            self.fail(
                path,
                key,
                "is not a valid label key: an optional DNS subdomain prefix and '/', then "
                "at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
                "letter or digit",
            )
        return key

    def label_value(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, value, "must be a string (quote it in YAML)")
        if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
            self.fail(
                path,
                value,
                "is not a valid label value: empty, or at most 63 letters, digits, '-', '_' "
                "or '.', starting and ending with a letter or digit",
            )
        return value

    def labels(self, value: object, path: str) -> Labels:
        pairs = self.mapping(value, path)
        return labels_of(
            (self.label_key(k, path), self.label_value(v, f"{path}[{k}]")) for k, v in pairs.items()
        )

    def selector(self, value: object, path: str) -> LabelSelector:
        spec = self.mapping(value, path)
        match_labels = self.labels(spec.get("matchLabels"), f"{path}.matchLabels")
        requirements = []
        for i, item in enumerate(
            self.items(spec.get("matchExpressions"), f"{path}.matchExpressions")
        ):
            at = f"{path}.matchExpressions[{i}]"
            item = self.mapping(item, at)
            key = self.label_key(item.get("key"), f"{at}.key")
            operator = item.get("operator")
            if operator not in OPERATORS:
                self.fail(f"{at}.operator", operator, "is not one of " + ", ".join(OPERATORS))
            values = self.items(item.get("values"), f"{at}.values")
            if operator in ("In", "NotIn") and not values:
                self.fail(f"{at}.values", values, f"must not be empty when operator is {operator}")
            if operator in ("Exists", "DoesNotExist") and values:
                self.fail(f"{at}.values", values, f"must be empty when operator is {operator}")
            checked = frozenset(
                sys.intern(self.label_value(v, f"{at}.values[{j}]")) for j, v in enumerate(values)
            )
            requirements.append(Requirement(sys.intern(key), operator, checked))
        # Canonical order, so that equal selectors are one cache entry.
        requirements = sorted(
            set(requirements), key=lambda r: (r.key, r.operator, sorted(r.values))
        )
        return LabelSelector(match_labels, tuple(requirements))

    def protocol(self, value: object, path: str) -> str:
        if value is None:
            return "TCP"
        if value not in PROTOCOLS:
            self.fail(path, value, "is not one of " + ", ".join(PROTOCOLS))
        return str(value)

    def port_name(self, value: str, path: str) -> str:
        if (
            len(value) > 15
            or not _PORT_NAME.fullmatch(value)
            or "--" in value
            or not re.search("[a-z]", value)
        ):
            self.fail(
                path,
                value,
                "is not a valid port name: at most 15 lower-case letters, digits and '-', "
                "with at least one letter",
            )
        return sys.intern(value)

    def ip(self, value: object, path: str) -> str:
        try:
            return str(legacy_ip(self.string(value, path)))
        except ValueError:
            self.fail(path, value, "is not an IP address")

    def cidr(self, value: object, path: str) -> IPNetwork:
        text = self.string(value, path)
        try:
            return legacy_cidr(text)
        except ValueError as err:
            mapped = str(err) == MAPPED_REFUSAL
            self.fail(path, value, MAPPED_REFUSAL if mapped else "is not a valid CIDR")


def _api_version(reader: _Reader, obj: Mapping[str, Any]) -> None:
    version = obj.get("apiVersion")
    if version is not None and version != API_VERSIONS[reader.kind]:
        reader.fail("apiVersion", version, f"is not {API_VERSIONS[reader.kind]}")


def parse_namespace(obj: Mapping[str, Any]) -> Namespace:
    reader = _Reader("Namespace")
    _api_version(reader, reader.mapping(obj, ""))
    _, name = reader.metadata(obj, namespaced=False)
    labels = reader.labels(reader.mapping(obj.get("metadata"), "").get("labels"), "metadata.labels")
    # As the API server does: the name label is always there and always right.
    pairs = {k: v for k, v in labels if k != NAMESPACE_NAME_LABEL}
    pairs[NAMESPACE_NAME_LABEL] = name
    return Namespace(sys.intern(name), labels_of(pairs))


def _container_ports(reader: _Reader, spec: Mapping[str, Any]) -> tuple[ContainerPort, ...]:
    ports = []
    for c, container in enumerate(reader.items(spec.get("containers"), "spec.containers")):
        at = f"spec.containers[{c}]"
        container = reader.mapping(container, at)
        for p, port in enumerate(reader.items(container.get("ports"), f"{at}.ports")):
            at_port = f"{at}.ports[{p}]"
            port = reader.mapping(port, at_port)
            name = port.get("name")
            if name is not None:
                name = reader.port_name(reader.string(name, f"{at_port}.name"), f"{at_port}.name")
            number = reader.integer(port.get("containerPort"), f"{at_port}.containerPort", 1, 65535)
            protocol = reader.protocol(port.get("protocol"), f"{at_port}.protocol")
            ports.append(ContainerPort(name or "", number, protocol))
    return tuple(ports)


def _pod_ips(reader: _Reader, status: Mapping[str, Any]) -> tuple[str, ...]:
    if status.get("phase") in TERMINATED_PHASES:
        return ()
    ips = []
    for i, entry in enumerate(reader.items(status.get("podIPs"), "status.podIPs")):
        at = f"status.podIPs[{i}]"
        ips.append(reader.ip(reader.mapping(entry, at).get("ip"), f"{at}.ip"))
    if not ips and status.get("podIP"):
        ips.append(reader.ip(status["podIP"], "status.podIP"))
    return tuple(dict.fromkeys(ips))


def parse_pod(obj: Mapping[str, Any]) -> Pod:
    reader = _Reader("Pod")
    _api_version(reader, reader.mapping(obj, ""))
    namespace, name = reader.metadata(obj, namespaced=True)
    spec = reader.mapping(obj.get("spec"), "spec")
    return Pod(
        namespace=namespace,
        name=name,
        labels=reader.labels(obj["metadata"].get("labels"), "metadata.labels"),
        ips=_pod_ips(reader, reader.mapping(obj.get("status"), "status")),
        node_name=sys.intern(reader.string(spec.get("nodeName") or "", "spec.nodeName")),
        ports=_container_ports(reader, spec),
        host_network=reader.boolean(spec.get("hostNetwork"), "spec.hostNetwork"),
        uid=str(obj["metadata"].get("uid") or ""),
    )


def _ip_block(reader: _Reader, value: object, path: str) -> IPBlock:
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


def _peer(reader: _Reader, value: object, path: str) -> Peer:
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


def _policy_port(reader: _Reader, value: object, path: str) -> PolicyPort:
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


def _rule(reader: _Reader, value: object, at: str, peers_field: str) -> PolicyRule:
    rule = reader.mapping(value, at)
    peers = reader.items(rule.get(peers_field), f"{at}.{peers_field}")
    ports = reader.items(rule.get("ports"), f"{at}.ports")
    return PolicyRule(
        peers=tuple(_peer(reader, p, f"{at}.{peers_field}[{j}]") for j, p in enumerate(peers)),
        ports=tuple(_policy_port(reader, p, f"{at}.ports[{j}]") for j, p in enumerate(ports)),
    )


def _rules(
    reader: _Reader, value: object, path: str, peers_field: str, published: bool
) -> tuple[PolicyRule, ...]:
    rules = []
    for i, rule in enumerate(reader.items(value, path)):
        if published and isinstance(rule, Mapping) and "refused" in rule:
            rules.append(PolicyRule(refused=reader.string(rule["refused"], f"{path}[{i}].refused")))
        else:
            rules.append(_rule(reader, rule, f"{path}[{i}]", peers_field))
    return tuple(rules)


def _policy_types(reader: _Reader, spec: Mapping[str, Any]) -> tuple[str, ...]:
    types = reader.items(spec.get("policyTypes"), "spec.policyTypes")
    for i, policy_type in enumerate(types):
        if policy_type not in POLICY_TYPES:
            reader.fail(f"spec.policyTypes[{i}]", policy_type, "is not one of Ingress, Egress")
    return tuple(t for t in POLICY_TYPES if t in types)


def parse_network_policy(obj: Mapping[str, Any], *, published: bool = False) -> NetworkPolicy:
    """A NetworkPolicy read strictly: any field sluice cannot read is an error (for
    manifests, refused whole). ``published``: the form the controller publishes, whose
    rules may say they were refused (``render.policy_spec_json``)."""
    reader = _Reader("NetworkPolicy")
    _api_version(reader, reader.mapping(obj, ""))
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
    reader = _Reader("NetworkPolicy")
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


def parse_service(obj: Mapping[str, Any]) -> Service:
    reader = _Reader("Service")
    _api_version(reader, reader.mapping(obj, ""))
    namespace, name = reader.metadata(obj, namespaced=True)
    spec = reader.mapping(obj.get("spec"), "spec")
    cluster_ips = reader.items(spec.get("clusterIPs"), "spec.clusterIPs")
    paths = [f"spec.clusterIPs[{i}]" for i in range(len(cluster_ips))]
    if not cluster_ips and spec.get("clusterIP"):
        cluster_ips, paths = [spec["clusterIP"]], ["spec.clusterIP"]
    ips = tuple(
        reader.ip(ip, at) for ip, at in zip(cluster_ips, paths, strict=True) if ip != "None"
    )
    selector = spec.get("selector")
    ports = []
    for i, port in enumerate(reader.items(spec.get("ports"), "spec.ports")):
        at = f"spec.ports[{i}]"
        port = reader.mapping(port, at)
        number = reader.integer(port.get("port"), f"{at}.port", 1, 65535)
        target = port.get("targetPort", number)
        ports.append(
            ServicePort(
                name=reader.string(port.get("name") or "", f"{at}.name"),
                port=number,
                target_port=reader.port_name(target, f"{at}.targetPort")
                if isinstance(target, str)
                else reader.integer(target, f"{at}.targetPort", 1, 65535),
                protocol=reader.protocol(port.get("protocol"), f"{at}.protocol"),
            )
        )
    return Service(
        namespace=namespace,
        name=name,
        cluster_ips=ips,
        selector=None if selector is None else reader.labels(selector, "spec.selector"),
        ports=tuple(ports),
    )


PARSERS: dict[str, Callable[[Mapping[str, Any]], KubeObject]] = {
    "Namespace": parse_namespace,
    "Pod": parse_pod,
    "NetworkPolicy": parse_network_policy,
    "Service": parse_service,
}


def parse_object(obj: Mapping[str, Any]) -> KubeObject:
    """Any of the kinds the resolver reads, chosen by ``kind``."""
    if not isinstance(obj, Mapping):
        raise PolicyInputError("object", "", obj, "must be an object")
    kind = obj.get("kind")
    if kind not in PARSERS:
        raise PolicyInputError(
            "object",
            "kind",
            MISSING if kind is None else kind,
            "is not one of " + ", ".join(PARSERS),
        )
    return PARSERS[kind](obj)
