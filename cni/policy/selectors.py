"""Label selector matching and which pods a NetworkPolicy peer or target means.

A peer's selectors pick pods in one of three ways:

- podSelector only: pods in the policy's own namespace that match it;
- namespaceSelector only: every pod of the namespaces that match it;
- both: pods that match the podSelector, in namespaces that match the
  namespaceSelector.

Each way is a ``PodGroup``: a fixed namespace or a namespace selector, then a
pod selector. Equal groups from different policies are one cache entry in
``groups.PodGroups``. An ipBlock is no group: it is addresses (see
``ip_block_contains``), which match pod addresses too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cni.policy.model import (
    EVERYTHING,
    IPBlock,
    Labels,
    LabelSelector,
    NetworkPolicy,
    Peer,
    Requirement,
)


def label_value(labels: Labels, key: str) -> str | None:
    for label_key, value in labels:
        if label_key == key:
            return value
    return None


def requirement_matches(requirement: Requirement, labels: Labels) -> bool:
    value = label_value(labels, requirement.key)
    operator = requirement.operator
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":  # an absent key is "not in" any set, as Kubernetes has it
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    raise ValueError(f"unknown selector operator {operator!r}")


def selector_matches(selector: LabelSelector, labels: Labels) -> bool:
    """Kubernetes' meaning: every matchLabels pair and every expression holds; {} matches all."""
    return selector.match_labels <= labels and all(
        requirement_matches(requirement, labels) for requirement in selector.match_expressions
    )


@dataclass(frozen=True, slots=True)
class PodGroup:
    """The pods a selector pair picks: in ``namespace``, or in namespaces matching
    ``namespace_selector`` (exactly one of the two is set), that match ``pod_selector``."""

    namespace: str | None
    namespace_selector: LabelSelector | None
    pod_selector: LabelSelector

    def __str__(self) -> str:
        where = (
            f"namespace {self.namespace}"
            if self.namespace is not None
            else f"namespaces {describe_selector(self.namespace_selector or EVERYTHING)}"
        )
        return f"pods {describe_selector(self.pod_selector)} in {where}"


ALL_PODS = PodGroup(None, EVERYTHING, EVERYTHING)


def target_group(policy: NetworkPolicy) -> PodGroup:
    """The pods a policy applies to: its podSelector, in its own namespace."""
    return PodGroup(policy.namespace, None, policy.pod_selector)


def peer_group(policy_namespace: str, peer: Peer) -> PodGroup | None:
    """The pods a peer's selectors pick, or None for an ipBlock peer."""
    if peer.ip_block is not None:
        return None
    if peer.namespace_selector is None:
        return PodGroup(policy_namespace, None, peer.pod_selector or EVERYTHING)
    return PodGroup(None, peer.namespace_selector, peer.pod_selector or EVERYTHING)


@dataclass(frozen=True, slots=True)
class AddressBlock:
    """An ipBlock parsed once, for testing many addresses."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    excepts: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def of(cls, block: IPBlock) -> AddressBlock:
        return cls(
            ipaddress.ip_network(block.cidr, strict=False),
            tuple(ipaddress.ip_network(e, strict=False) for e in block.excepts),
        )

    def contains(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return (
            ip.version == self.network.version
            and ip in self.network
            and not any(ip in excepted for excepted in self.excepts)
        )


def ip_block_contains(block: IPBlock, address: str) -> bool:
    """Whether an ipBlock (its CIDR minus its excepts) holds ``address``."""
    return AddressBlock.of(block).contains(address)


def describe_selector(selector: LabelSelector) -> str:
    """A selector in kubectl's notation: ``app=web,tier in (a,b),!legacy``; ``{}`` for all."""
    if selector.is_empty:
        return "{}"
    parts = [f"{key}={value}" for key, value in sorted(selector.match_labels)]
    for requirement in selector.match_expressions:
        values = ",".join(sorted(requirement.values))
        parts.append(
            {
                "In": f"{requirement.key} in ({values})",
                "NotIn": f"{requirement.key} notin ({values})",
                "Exists": requirement.key,
                "DoesNotExist": f"!{requirement.key}",
            }[requirement.operator]
        )
    return ",".join(parts)
