"""The model back into API JSON: what ``parse`` reads, written so that parsing it again
gives an equal object (a policy's refused rules and refusals too, in the published
form: ``parse_network_policy(..., published=True)``).

The controller publishes each policy's rules this way (``cni.k8s.published``), so
an agent reads them with the same parser as a NetworkPolicy from the API, and
describes each selector group it publishes. Output is canonical: selector
expressions sorted, values sorted, absent fields left out (never null).
"""

from __future__ import annotations

from typing import Any

from cni.policy.model import (
    IPBlock,
    LabelSelector,
    NetworkPolicy,
    Peer,
    PolicyPort,
    PolicyRule,
)
from cni.policy.selectors import PodGroup


def selector_json(selector: LabelSelector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if selector.match_labels:
        out["matchLabels"] = dict(sorted(selector.match_labels))
    if selector.match_expressions:
        expressions = []
        for requirement in selector.match_expressions:
            expression: dict[str, Any] = {
                "key": requirement.key,
                "operator": requirement.operator,
            }
            if requirement.values:
                expression["values"] = sorted(requirement.values)
            expressions.append(expression)
        out["matchExpressions"] = expressions
    return out


def _ip_block_json(block: IPBlock) -> dict[str, Any]:
    out: dict[str, Any] = {"cidr": block.cidr}
    if block.excepts:
        out["except"] = list(block.excepts)
    return out


def _peer_json(peer: Peer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.pod_selector is not None:
        out["podSelector"] = selector_json(peer.pod_selector)
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = selector_json(peer.namespace_selector)
    if peer.ip_block is not None:
        out["ipBlock"] = _ip_block_json(peer.ip_block)
    return out


def _port_json(port: PolicyPort) -> dict[str, Any]:
    out: dict[str, Any] = {"protocol": port.protocol}
    if port.port is not None:
        out["port"] = port.port
    if port.end_port is not None:
        out["endPort"] = port.end_port
    return out


def _rule_json(rule: PolicyRule, peers_field: str) -> dict[str, Any]:
    if rule.refused:
        return {"refused": rule.refused}  # read back with parse(..., published=True)
    out: dict[str, Any] = {}
    if rule.peers:
        out[peers_field] = [_peer_json(peer) for peer in rule.peers]
    if rule.ports:
        out["ports"] = [_port_json(port) for port in rule.ports]
    return out


def policy_spec_json(policy: NetworkPolicy) -> dict[str, Any]:
    """The policy's ``spec`` as the resolver reads it (policyTypes as written)."""
    spec: dict[str, Any] = {"podSelector": selector_json(policy.pod_selector)}
    if policy.policy_types:
        spec["policyTypes"] = list(policy.policy_types)
    if policy.ingress:
        spec["ingress"] = [_rule_json(rule, "from") for rule in policy.ingress]
    if policy.egress:
        spec["egress"] = [_rule_json(rule, "to") for rule in policy.egress]
    if policy.refusals:
        spec["refusals"] = list(policy.refusals)
    return spec


def group_json(group: PodGroup) -> dict[str, Any]:
    """A selector group: ``namespace`` or ``namespaceSelector``, and ``podSelector``."""
    out: dict[str, Any] = {}
    if group.namespace is not None:
        out["namespace"] = group.namespace
    else:
        out["namespaceSelector"] = selector_json(group.namespace_selector or LabelSelector())
    out["podSelector"] = selector_json(group.pod_selector)
    return out
