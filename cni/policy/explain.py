"""What a pod may receive and send, and the verdict for one flow, with the reasons.

Both read the pod's ``ResolvedPolicy``, the very rules the datapath gets, and
judge a flow the way the datapath does (``rule_allows``): a peer matches a
CIDR outside its excepts (no peers: any), a port matches a protocol's port,
range or any port (no ports: any port and protocol, ICMP included).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from cni.policy.index import PolicyIndex
from cni.policy.model import DIRECTIONS, Direction, PodKey, PolicyKey, label_dict
from cni.policy.rules import RuleOrigin
from cni.policy.vocabulary import AllowRule, PeerCIDR, Ports


def _name(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def _peer_matches(peer: PeerCIDR, address: ipaddress.IPv4Address) -> bool:
    return address in ipaddress.IPv4Network(peer.cidr, strict=False) and not any(
        address in ipaddress.IPv4Network(e, strict=False) for e in peer.excepts
    )


def _port_matches(ports: Ports, protocol: str, port: int) -> bool:
    if ports.protocol == "any":
        return True
    if ports.protocol != protocol:
        return False
    first, last = ports.span
    return first == 0 or first <= port <= last


def rule_allows(rule: AllowRule, address: str, port: int, protocol: str) -> bool:
    """Whether the datapath lets this flow through ``rule`` (peer: the other end)."""
    ip = ipaddress.IPv4Address(address)
    protocol = protocol.lower()
    return (not rule.peers or any(_peer_matches(peer, ip) for peer in rule.peers)) and (
        not rule.ports or any(_port_matches(p, protocol, port) for p in rule.ports)
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str
    policy: PolicyKey | None = None  # the policy whose rule allows it
    rule_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "policy": None if self.policy is None else _name(self.policy),
            "rule": self.rule_index,
        }


def verdict(
    index: PolicyIndex,
    pod_key: PodKey,
    direction: Direction,
    peer_address: str,
    port: int,
    protocol: str,
) -> Verdict:
    """Allow or deny for a new flow of the pod with ``peer_address`` (the source for
    ingress, the destination for egress) to ``port`` (0 for ICMP), and why."""
    resolved = index.resolve(pod_key)
    rules = resolved.rules(direction)
    if rules is None:
        return Verdict(True, "not isolated: default allow")
    names = ", ".join(_name(key) for key in resolved.policies(direction))
    pod = index.pod(pod_key)
    if pod is not None and peer_address in pod.ips:
        return Verdict(True, "a pod may always reach itself")
    if ipaddress.ip_address(peer_address).version == 6:
        return Verdict(False, f"isolated by policies [{names}]; IPv6 is dropped (IPv4 datapath)")
    for rule, origin in zip(rules, resolved.origins(direction), strict=True):
        if rule_allows(rule, peer_address, port, protocol):
            return Verdict(True, f"allowed by {origin}", origin.policy, origin.rule_index)
    refused = _refused_rules(index, resolved.policies(direction), direction)
    unread = "".join(
        f"; {_name(r.policy)} {direction} rule {r.rule_index} is refused and allows nothing"
        f" ({r.reason})"
        for r in refused
    )
    return Verdict(False, f"isolated by policies [{names}]; no rule allows it{unread}")


# Explanations.


@dataclass(frozen=True, slots=True)
class AllowLine:
    origin: RuleOrigin
    peers: tuple[str, ...]  # ("any",) or pod names and CIDRs
    ports: tuple[str, ...]  # ("any",) or "TCP 80", "UDP 5000-5010", "SCTP any"


@dataclass(frozen=True, slots=True)
class RefusedRule:
    """A rule of an isolating policy that sluice cannot read: it allows nothing."""

    policy: PolicyKey
    rule_index: int
    reason: str


@dataclass(frozen=True, slots=True)
class DirectionExplanation:
    direction: Direction
    isolated: bool
    policies: tuple[PolicyKey, ...] = ()
    allows: tuple[AllowLine, ...] = ()
    refused: tuple[RefusedRule, ...] = ()


@dataclass(frozen=True, slots=True)
class Explanation:
    pod: PodKey
    addresses: tuple[str, ...]
    labels: dict[str, str]
    host_network: bool
    selected_by: tuple[PolicyKey, ...]
    directions: tuple[DirectionExplanation, ...] = field(default=())
    # The selecting policies sluice could not read whole, and what it could not read.
    refused: dict[PolicyKey, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON or YAML."""
        out: dict[str, Any] = {
            "pod": _name(self.pod),
            "addresses": list(self.addresses),
            "labels": self.labels,
            "hostNetwork": self.host_network,
            "selectedBy": [_name(k) for k in self.selected_by],
            "refused": {_name(k): list(v) for k, v in self.refused.items()},
        }
        for part in self.directions:
            out[part.direction] = {
                "isolated": part.isolated,
                "policies": [_name(k) for k in part.policies],
                "allows": [
                    {
                        "by": str(line.origin),
                        "policy": None if line.origin.policy is None else _name(line.origin.policy),
                        "rule": line.origin.rule_index,
                        "peers": list(line.peers),
                        "ports": list(line.ports),
                    }
                    for line in part.allows
                ],
                "refusedRules": [
                    {"policy": _name(r.policy), "rule": r.rule_index, "reason": r.reason}
                    for r in part.refused
                ],
            }
        return out

    def to_text(self) -> str:
        addresses = ", ".join(self.addresses) or "no address"
        lines = [f"pod {_name(self.pod)} ({addresses})"]
        if self.host_network:
            lines.append("  hostNetwork: no policy applies to it")
        for key, reasons in self.refused.items():
            lines.append(
                f"policy {_name(key)} is refused (the API server accepted it, sluice cannot "
                f"read it all): {'; '.join(reasons)}"
            )
        for part in self.directions:
            verb, towards = ("receive", "from") if part.direction == "ingress" else ("send", "to")
            if not part.isolated:
                lines.append(f"{part.direction}: not isolated, may {verb} anything")
                continue
            names = ", ".join(_name(k) for k in part.policies)
            lines.append(f"{part.direction}: isolated by {names}; may {verb} only:")
            if not part.allows:
                lines.append("  nothing")
            for line in part.allows:
                lines.append(
                    f"  {towards} {', '.join(line.peers)} on {', '.join(line.ports)}"
                    f"  [{line.origin}]"
                )
            for refused in part.refused:
                lines.append(
                    f"  nothing by {_name(refused.policy)} {part.direction} rule "
                    f"{refused.rule_index}: refused, {refused.reason}"
                )
        return "\n".join(lines)


def _ports_text(ports: tuple[Ports, ...]) -> tuple[str, ...]:
    if not ports:
        return ("any port and protocol",)
    shown = []
    for p in ports:
        first, last = p.span
        if p.protocol == "any":
            shown.append("any port and protocol")
        elif first == 0:
            shown.append(f"{p.protocol.upper()} any port")
        elif first == last:
            shown.append(f"{p.protocol.upper()} {first}")
        else:
            shown.append(f"{p.protocol.upper()} {first}-{last}")
    return tuple(shown)


def _peers_text(
    rule: AllowRule, origin: RuleOrigin, pods_by_address: dict[str, list[str]]
) -> tuple[str, ...]:
    if not rule.peers:
        return ("any peer",)
    shown = []
    for peer in rule.peers:
        address, _, length = peer.cidr.partition("/")
        if length == "32" and not peer.excepts and address in pods_by_address:
            shown.extend(pods_by_address[address])
        elif peer.excepts:
            shown.append(f"{peer.cidr} except {', '.join(peer.excepts)}")
        else:
            shown.append(peer.cidr)
    return tuple(dict.fromkeys(shown))


def explain(index: PolicyIndex, pod_key: PodKey) -> Explanation:
    """Which policies select the pod, and what it may receive and send."""
    pod = index.pod(pod_key)
    if pod is None:
        raise KeyError(f"unknown pod {_name(pod_key)}")
    resolved = index.resolve(pod_key)
    pods_by_address: dict[str, list[str]] = {}
    for other in index.store.all_pods():
        for ip in other.ips:
            pods_by_address.setdefault(ip, []).append(_name(other.key))
    parts = []
    for direction in DIRECTIONS:
        rules = resolved.rules(direction)
        if rules is None:
            parts.append(DirectionExplanation(direction, isolated=False))
            continue
        itself = AllowLine(RuleOrigin(direction), ("itself",), _ports_text(()))
        lines = (
            itself,
            *(
                AllowLine(
                    origin, _peers_text(rule, origin, pods_by_address), _ports_text(rule.ports)
                )
                for rule, origin in zip(rules, resolved.origins(direction), strict=True)
            ),
        )
        parts.append(
            DirectionExplanation(
                direction,
                True,
                resolved.policies(direction),
                lines,
                _refused_rules(index, resolved.policies(direction), direction),
            )
        )
    refused = {}
    for key in resolved.selected_by:
        policy = index.policy(key)
        if policy is not None and policy.refused:
            refused[key] = policy.refusals
    return Explanation(
        pod=pod_key,
        addresses=pod.ips,
        labels=label_dict(pod.labels),
        host_network=pod.host_network,
        selected_by=resolved.selected_by,
        directions=tuple(parts),
        refused=refused,
    )


def _refused_rules(
    index: PolicyIndex, policies: tuple[PolicyKey, ...], direction: Direction
) -> tuple[RefusedRule, ...]:
    out = []
    for key in policies:
        policy = index.policy(key)
        for i, rule in enumerate(policy.rules(direction) if policy is not None else ()):
            if rule.refused:
                out.append(RefusedRule(key, i, rule.refused))
    return tuple(out)
