"""Resolving with selector groups that were resolved elsewhere: the controller resolves
every distinct selector once for the cluster and publishes each group's pods (an
*address set*); an agent compiles a policy's rules from those sets with ``rules``,
exactly as ``PolicyIndex`` compiles them from its own groups.

Both sides derive the same address sets from a policy (``address_sets``):

- one per selector group the policy's isolating rules read (``peer_groups``);
- with the pods' named container ports when an egress rule with named ports reads
  the group (egress named ports resolve on each peer pod);
- for an egress named port towards an ipBlock or any peer (resolved on every pod
  whose address falls inside), every pod that has a port of one of those names
  (``only_named``), unless the policy reads every pod anyway.

An address set holds only pods with an address: a pod without one is no peer and
adds nothing to any rule, so it need not be published. Equal sets of different
policies are one set: a group that 100 policies read is published once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import cast

from cni.policy.model import DIRECTIONS, ContainerPort, NetworkPolicy, Pod, PodKey
from cni.policy.rules import NamedPorts, host_peer, named_allows, needs_all_pods, pod_peers
from cni.policy.selectors import ALL_PODS, PodGroup, peer_group
from cni.policy.vocabulary import AllowRule, PeerCIDR

NamedPortSet = frozenset[tuple[str, str]]  # (port name, protocol)


@dataclass(frozen=True, slots=True)
class AddressSetKey:
    """What one address set holds: the pods of ``group`` that have an address, with
    their named ports when ``ports``, only those with a port in ``only_named`` when set."""

    group: PodGroup
    ports: bool = False
    only_named: NamedPortSet | None = None

    def admits(self, pod: Pod) -> bool:
        """Whether a member of the group belongs in the set."""
        if not pod.ips:
            return False
        if self.only_named is None:
            return True
        return any((port.name, port.protocol) in self.only_named for port in pod.ports)

    def published_ports(self, pod: Pod) -> tuple[ContainerPort, ...]:
        """The pod's ports as the set carries them: named ones, only if it carries ports."""
        if not self.ports:
            return ()
        return tuple(
            port
            for port in pod.ports
            if port.name
            and (self.only_named is None or (port.name, port.protocol) in self.only_named)
        )


def address_sets(policy: NetworkPolicy) -> tuple[AddressSetKey, ...]:
    """The policy's address sets, one per group it reads, in a fixed order (rules in
    order, peers in order, then the every-pod lookup of named ports)."""
    order: dict[PodGroup, bool] = {}  # group -> read by an egress rule with named ports
    lookup_names: set[tuple[str, str]] = set()
    for direction in DIRECTIONS:
        if not policy.isolates(direction):
            continue
        for rule in policy.rules(direction):
            named = direction == "egress" and any(isinstance(p.port, str) for p in rule.ports)
            for peer in rule.peers:
                group = peer_group(policy.namespace, peer)
                if group is not None:
                    order[group] = order.get(group, False) or named
            if needs_all_pods(direction, rule):
                lookup_names.update(
                    (p.port, p.protocol) for p in rule.ports if isinstance(p.port, str)
                )
    keys = [AddressSetKey(group, ports) for group, ports in order.items()]
    if lookup_names:
        if ALL_PODS in order:  # every pod is read already: give it its ports
            keys = [AddressSetKey(k.group, True) if k.group == ALL_PODS else k for k in keys]
        else:
            keys.append(AddressSetKey(ALL_PODS, True, frozenset(lookup_names)))
    return tuple(keys)


class PublishedSet:
    """An address set's pods as an agent holds them, and values derived from them
    (shared by every policy that reads the set)."""

    def __init__(self, pods: Mapping[PodKey, Pod]) -> None:
        self.pods = dict(pods)
        self._ordered: list[PodKey] | None = None
        self._members: set[PodKey] | None = None
        self.derived: dict[Hashable, object] = {}

    def ordered(self) -> list[PodKey]:
        if self._ordered is None:
            self._ordered = sorted(self.pods)
        return self._ordered

    def members(self) -> set[PodKey]:
        if self._members is None:
            self._members = set(self.pods)
        return self._members


class PublishedPeers:
    """``rules.PeerSource`` over address sets: what a policy's compilation reads."""

    def __init__(self, sets: Mapping[AddressSetKey, PublishedSet]) -> None:
        self.sets = {key.group: published for key, published in sets.items()}
        # A pod in several sets: the copy with the most ports wins (sets without ports,
        # then those with only some, then those with all), for named-port lookups.
        self._richest = sorted(sets, key=lambda k: (k.ports, k.only_named is None))
        self._by_key = sets
        self._all: dict[PodKey, Pod] | None = None

    def _set(self, group: PodGroup) -> PublishedSet:
        return self.sets[group]

    def group_peers(
        self, group: PodGroup, extra: tuple[PeerCIDR, ...] = ()
    ) -> tuple[PeerCIDR, ...]:
        published = self._set(group)
        peers = published.derived.get(("peers", extra))
        if peers is None:
            pods = published.pods
            # As rules.pod_peers, in one pass: a set may hold thousands of pods, and
            # an agent computes this again for each set a change rewrites.
            own = tuple(
                host_peer(ip) for k in published.ordered() for ip in pods[k].ips if ":" not in ip
            )
            peers = published.derived[("peers", extra)] = own + extra
        return cast(tuple[PeerCIDR, ...], peers)

    def group_pods(self, group: PodGroup) -> Sequence[Pod]:
        published = self._set(group)
        return [published.pods[key] for key in published.ordered()]

    def members(self, group: PodGroup) -> set[PodKey]:
        return self._set(group).members()

    def _pod(self, key: PodKey) -> Pod:
        if self._all is None:
            self._all = {}
            for set_key in self._richest:
                self._all.update(self._by_key[set_key].pods)
        return self._all[key]

    def pods_of(self, keys: Iterable[PodKey]) -> Sequence[Pod]:
        return [self._pod(key) for key in sorted(keys)]

    def pod_peers(self, pod: Pod) -> tuple[PeerCIDR, ...]:
        return pod_peers(pod)

    def peers_of(self, keys: set[PodKey]) -> tuple[PeerCIDR, ...]:
        return tuple(chain.from_iterable(pod_peers(self._pod(key)) for key in sorted(keys)))

    def named_allows(self, group: PodGroup, named: NamedPorts) -> tuple[AllowRule, ...]:
        published = self._set(group)
        allows = published.derived.get(named)
        if allows is None:
            allows = published.derived[named] = named_allows(
                self.group_pods(group), named, pod_peers
            )
        return cast(tuple[AllowRule, ...], allows)
