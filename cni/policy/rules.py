"""One NetworkPolicy's rules as datapath allow rules, with where each came from.

A rule becomes datapath ``AllowRule``s as follows:
- peers: each selector peer is its group's pod addresses (/32; pods without
  an address are no peers), each ipBlock its CIDR with its excepts; no peers
  at all is any peer. A rule whose peers all came to nothing (selectors that
  match no addressed pod, or only IPv6 blocks, which the IPv4 datapath
  cannot hold) allows nothing: it must not become "any peer".
- ports: a number (with endPort, a range), no number (every port of the
  protocol), no ports at all (every port and protocol), or a name:
  - ingress: the target pod's own container port of that name and protocol,
    so it is resolved per target pod (``CompiledRule.for_target``);
  - egress: each peer pod's container port of that name and protocol; peers
    that resolve to the same ports share one AllowRule. A peer pod without
    such a port is not reached through that name. For an ipBlock peer (and
    for a rule without peers), the named port is resolved on every pod whose
    address falls inside the block (any pod); other addresses have no named
    ports, so a name allows nothing towards them.
  A named port that resolves to nothing allows nothing (never "any port").

Everything but ingress named ports is the same for every pod a policy
selects, so a policy is compiled once and shared by all its target pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cni.datapath.policy import AllowRule, PeerCIDR, Ports
from cni.policy.model import (
    DIRECTIONS,
    Direction,
    NetworkPolicy,
    Pod,
    PolicyKey,
    PolicyPort,
    PolicyRule,
)
from cni.policy.selectors import ALL_PODS, AddressBlock, PodGroup, peer_group


class PeerSource(Protocol):
    """What compiling needs from the resolver's state."""

    def group_peers(self, group: PodGroup) -> tuple[PeerCIDR, ...]: ...

    def group_pods(self, group: PodGroup) -> Sequence[Pod]: ...


@dataclass(frozen=True, slots=True)
class RuleOrigin:
    """Why an allow rule exists: a policy's rule, or (policy None) the pod's own address."""

    direction: Direction
    policy: PolicyKey | None = None
    rule_index: int | None = None

    def __str__(self) -> str:
        if self.policy is None:
            return "the pod's own address"
        return f"{self.policy[0]}/{self.policy[1]} {self.direction} rule {self.rule_index}"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    origin: RuleOrigin
    allows: tuple[AllowRule, ...]  # the same for every target pod
    # Ingress named ports, resolved per target pod; they apply to ``peers``
    # (() is any peer) together with the rule's numbered ``ports``.
    named_ports: tuple[tuple[str, str], ...] = ()
    peers: tuple[PeerCIDR, ...] = ()
    ports: tuple[Ports, ...] = ()

    def for_target(self, pod: Pod) -> tuple[AllowRule, ...]:
        if not self.named_ports:
            return self.allows
        named = [
            Ports(protocol.lower(), port.port, port.port)
            for name, protocol in self.named_ports
            for port in pod.ports
            if port.name == name and port.protocol == protocol
        ]
        ports = tuple(dict.fromkeys((*self.ports, *named)))
        return (AllowRule(self.peers, ports),) if ports else ()


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    key: PolicyKey
    ingress: tuple[CompiledRule, ...] | None  # None: the policy does not isolate ingress
    egress: tuple[CompiledRule, ...] | None

    def rules(self, direction: Direction) -> tuple[CompiledRule, ...] | None:
        return self.ingress if direction == "ingress" else self.egress


def pod_peers(pod: Pod) -> tuple[PeerCIDR, ...]:
    """A pod's IPv4 addresses as /32 peers (the datapath is IPv4 only)."""
    return tuple(PeerCIDR(f"{ip}/32") for ip in pod.ips if ":" not in ip)


def _numbered(port: PolicyPort) -> Ports:
    if port.port is None:
        return Ports(port.protocol.lower(), 0, 0)  # every port of the protocol
    assert isinstance(port.port, int)
    return Ports(port.protocol.lower(), port.port, port.end_port or port.port)


def _dedupe(items: Iterable[PeerCIDR]) -> tuple[PeerCIDR, ...]:
    return tuple(dict.fromkeys(items))


def _needs_all_pods(direction: Direction, rule: PolicyRule) -> bool:
    """An egress named port towards an ipBlock or any peer is looked up on every pod."""
    return (
        direction == "egress"
        and any(isinstance(p.port, str) for p in rule.ports)
        and (not rule.peers or any(peer.ip_block is not None for peer in rule.peers))
    )


def peer_groups(policy: NetworkPolicy) -> set[PodGroup]:
    """Every group the policy's compiled rules read (so that changes to them recompile it)."""
    groups = set()
    for direction in DIRECTIONS:
        if not policy.isolates(direction):
            continue
        for rule in policy.rules(direction):
            for peer in rule.peers:
                group = peer_group(policy.namespace, peer)
                if group is not None:
                    groups.add(group)
            if _needs_all_pods(direction, rule):
                groups.add(ALL_PODS)
    return groups


def compile_policy(policy: NetworkPolicy, source: PeerSource) -> CompiledPolicy:
    def direction_rules(direction: Direction) -> tuple[CompiledRule, ...] | None:
        if not policy.isolates(direction):
            return None
        return tuple(
            _compile_rule(policy, direction, index, rule, source)
            for index, rule in enumerate(policy.rules(direction))
        )

    return CompiledPolicy(policy.key, direction_rules("ingress"), direction_rules("egress"))


def _compile_rule(
    policy: NetworkPolicy, direction: Direction, index: int, rule: PolicyRule, source: PeerSource
) -> CompiledRule:
    origin = RuleOrigin(direction, policy.key, index)
    cidrs: list[PeerCIDR] = []
    for peer in rule.peers:
        if peer.ip_block is not None:
            if ":" not in peer.ip_block.cidr:
                cidrs.append(PeerCIDR(peer.ip_block.cidr, peer.ip_block.excepts))
        else:
            group = peer_group(policy.namespace, peer)
            assert group is not None
            cidrs.extend(source.group_peers(group))
    peers = _dedupe(cidrs) if len(rule.peers) > 1 else tuple(cidrs)
    reachable = not rule.peers or bool(peers)

    if not rule.ports:
        return CompiledRule(origin, (AllowRule(peers, ()),) if reachable else ())
    numbered = tuple(dict.fromkeys(_numbered(p) for p in rule.ports if not isinstance(p.port, str)))
    named = tuple(
        dict.fromkeys((p.port, p.protocol) for p in rule.ports if isinstance(p.port, str))
    )
    allows = (AllowRule(peers, numbered),) if numbered and reachable else ()
    if not named:
        return CompiledRule(origin, allows)
    if direction == "ingress":
        if not reachable:
            return CompiledRule(origin, ())
        return CompiledRule(origin, allows, named, peers, numbered)
    return CompiledRule(origin, allows + _named_egress(policy, rule, named, source))


def _named_egress(
    policy: NetworkPolicy,
    rule: PolicyRule,
    named: tuple[tuple[str, str], ...],
    source: PeerSource,
) -> tuple[AllowRule, ...]:
    """Allow rules for egress named ports: each peer pod's own port of that name."""
    found: dict[tuple[str, str], tuple[Pod, list[str]]] = {}  # pod key -> pod, peer addresses

    def add(pods: Iterable[Pod], block: AddressBlock | None = None) -> None:
        for pod in pods:
            ips = [ip for ip in pod.ips if ":" not in ip and (block is None or block.contains(ip))]
            if ips:
                found.setdefault(pod.key, (pod, []))[1].extend(ips)

    if not rule.peers:
        add(source.group_pods(ALL_PODS))
    for peer in rule.peers:
        if peer.ip_block is not None:
            if ":" not in peer.ip_block.cidr:
                add(source.group_pods(ALL_PODS), AddressBlock.of(peer.ip_block))
        else:
            group = peer_group(policy.namespace, peer)
            assert group is not None
            add(source.group_pods(group))

    by_ports: dict[tuple[Ports, ...], list[PeerCIDR]] = {}
    for key in sorted(found):
        pod, ips = found[key]
        ports = tuple(
            dict.fromkeys(
                Ports(protocol.lower(), port.port, port.port)
                for name, protocol in named
                for port in pod.ports
                if port.name == name and port.protocol == protocol
            )
        )
        if ports:
            by_ports.setdefault(ports, []).extend(PeerCIDR(f"{ip}/32") for ip in dict.fromkeys(ips))
    return tuple(AllowRule(tuple(peers), ports) for ports, peers in by_ports.items())
