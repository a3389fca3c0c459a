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

A rule sluice could not read (``PolicyRule.refused``) allows nothing.

Everything but ingress named ports is the same for every pod a policy
selects, so a policy is compiled once and shared by all its target pods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from cni.policy.model import (
    DIRECTIONS,
    Direction,
    NetworkPolicy,
    Pod,
    PodKey,
    PolicyKey,
    PolicyPort,
    PolicyRule,
)
from cni.policy.selectors import ALL_PODS, AddressBlock, PodGroup, peer_group
from cni.policy.vocabulary import AllowRule, PeerCIDR, Ports

NamedPorts: TypeAlias = tuple[tuple[str, str], ...]  # (port name, protocol)


class PeerSource(Protocol):
    """What compiling needs from the resolver's state."""

    def group_peers(
        self, group: PodGroup, extra: tuple[PeerCIDR, ...] = ()
    ) -> tuple[PeerCIDR, ...]:
        """The group's pods' addresses, in pod order, then ``extra`` (kept as one tuple,
        shared by every rule that has the same group and extra peers)."""
        ...

    def group_pods(self, group: PodGroup) -> Sequence[Pod]:
        """The group's pods, in key order."""
        ...

    def members(self, group: PodGroup) -> set[PodKey]: ...

    def pods_of(self, keys: set[PodKey]) -> Sequence[Pod]:
        """These pods, in key order."""
        ...

    def pod_peers(self, pod: Pod) -> tuple[PeerCIDR, ...]:
        """The pod's addresses as peers."""
        ...

    def peers_of(self, keys: set[PodKey]) -> tuple[PeerCIDR, ...]:
        """These pods' addresses, in pod order."""
        ...

    def named_allows(self, group: PodGroup, named: NamedPorts) -> tuple[AllowRule, ...]:
        """``named_allows`` of the group's pods."""
        ...


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
    named_ports: NamedPorts = ()
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
    return tuple(host_peer(ip) for ip in pod.ips if ":" not in ip)


@functools.lru_cache(maxsize=1 << 16)
def host_peer(ip: str) -> PeerCIDR:
    """An address as a /32 peer; one object per address, as a pod is a peer in every
    rule whose selector picks it."""
    return PeerCIDR(f"{ip}/32")


def _numbered(port: PolicyPort) -> Ports:
    if port.port is None:
        return Ports(port.protocol.lower(), 0, 0)  # every port of the protocol
    assert isinstance(port.port, int)
    return Ports(port.protocol.lower(), port.port, port.end_port or port.port)


def _selector_groups(policy: NetworkPolicy, rule: PolicyRule) -> list[PodGroup]:
    """The distinct groups of a rule's selector peers, in rule order."""
    groups = (peer_group(policy.namespace, peer) for peer in rule.peers)
    return list(dict.fromkeys(group for group in groups if group is not None))


def _rule_peers(
    policy: NetworkPolicy, rule: PolicyRule, source: PeerSource
) -> tuple[PeerCIDR, ...]:
    """The addresses of a rule's peers: selected pods (in pod order, each once), then ipBlocks."""
    groups = _selector_groups(policy, rule)
    blocks = tuple(
        dict.fromkeys(
            PeerCIDR(peer.ip_block.cidr, peer.ip_block.excepts)
            for peer in rule.peers
            if peer.ip_block is not None and ":" not in peer.ip_block.cidr  # IPv4 datapath
        )
    )
    if len(groups) == 1:
        return source.group_peers(groups[0], blocks)
    if groups:
        # Overlapping groups: each pod once, deduplicated by key (cheaper than by address).
        return source.peers_of(set().union(*(source.members(g) for g in groups))) + blocks
    return blocks


def needs_all_pods(direction: Direction, rule: PolicyRule) -> bool:
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
            if needs_all_pods(direction, rule):
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
    if rule.refused:
        return CompiledRule(origin, ())  # unreadable: allows nothing
    peers = _rule_peers(policy, rule, source)
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
    policy: NetworkPolicy, rule: PolicyRule, named: NamedPorts, source: PeerSource
) -> tuple[AllowRule, ...]:
    """Allow rules for egress named ports: each peer pod's own port of that name."""
    groups = _selector_groups(policy, rule)
    blocks = [
        AddressBlock.of(peer.ip_block)
        for peer in rule.peers
        if peer.ip_block is not None and ":" not in peer.ip_block.cidr
    ]
    # Cached and shared by every rule with the same single group (no peers: every pod).
    if not rule.peers:
        return source.named_allows(ALL_PODS, named)
    if len(groups) == 1 and len(rule.peers) == 1:
        return source.named_allows(groups[0], named)
    selected: set[PodKey] = set().union(*(source.members(g) for g in groups))

    def peers_of(pod: Pod) -> tuple[PeerCIDR, ...]:
        own = source.pod_peers(pod)
        if pod.key in selected:
            return own
        # Only the addresses inside an ipBlock are that block's peers.
        return tuple(p for p in own if any(b.contains(p.cidr[:-3]) for b in blocks))

    # With an ipBlock, any pod may have an address inside it.
    pods = source.group_pods(ALL_PODS) if blocks else source.pods_of(selected)
    return named_allows(pods, named, peers_of)


@functools.lru_cache(maxsize=4096)
def _single_port(protocol: str, port: int) -> Ports:
    return Ports(protocol.lower(), port, port)  # shared: many pods have the same port


def named_allows(
    pods: Iterable[Pod], named: NamedPorts, peers_of: Callable[[Pod], tuple[PeerCIDR, ...]]
) -> tuple[AllowRule, ...]:
    """One AllowRule per distinct set of ports the names resolve to, with the pods
    (their addresses from ``peers_of``) that resolve to it, in pod order."""
    by_ports: dict[tuple[Ports, ...], list[PeerCIDR]] = {}
    for pod in pods:
        ports = [
            _single_port(protocol, port.port)
            for name, protocol in named
            for port in pod.ports
            if port.name == name and port.protocol == protocol
        ]
        if not ports:
            continue
        peers = peers_of(pod)
        if peers:
            key = tuple(dict.fromkeys(ports)) if len(ports) > 1 else tuple(ports)
            by_ports.setdefault(key, []).extend(peers)
    return tuple(AllowRule(tuple(peers), ports) for ports, peers in by_ports.items())
