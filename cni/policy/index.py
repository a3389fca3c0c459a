"""The resolver over Kubernetes objects: ``PolicyIndex``, the agent's when it resolves
selectors itself, and ``GroupIndex``, the controller's, which keeps every selector's
group of pods current for publishing.

Scale: selectors are resolved once per distinct selector and kept up to date
by ``groups.PodGroups``; a policy is compiled once for all the pods it
selects; every update returns the local pods whose policy it may have
changed, and only their cached results are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import cast

from cni.policy.groups import PodGroups, Role
from cni.policy.kinds import KindHandlers
from cni.policy.model import (
    KubeObject,
    Namespace,
    NetworkPolicy,
    Pod,
    PodKey,
    PolicyKey,
    Service,
    ServiceKey,
)
from cni.policy.ownership import AddressOwnership
from cni.policy.resolve import PodPolicyResolver
from cni.policy.rules import (
    CompiledPolicy,
    NamedPorts,
    compile_policy,
    named_allows,
    peer_groups,
    pod_peers,
)
from cni.policy.selectors import PodGroup, target_group
from cni.policy.vocabulary import AllowRule, PeerCIDR

NOTHING: frozenset[PodKey] = frozenset()


class PolicyIndex(PodPolicyResolver[KubeObject]):
    """Resolver state: every object the agent knows, and caches derived from them.

    ``node_name`` picks the local pods (those the agent enforces for): pods on
    that node that are not hostNetwork; None makes every such pod local.
    Every ``upsert_*``/``delete_*`` (eight of its public methods: one pair per
    kind, what ``kinds`` dispatches to, which is why it has more than twenty)
    returns the local pods whose policy may have changed (possibly including a
    pod that no longer exists); resolve those again. ``resolve`` works for any
    pod; results for local pods are cached until an update names them.
    """

    def __init__(
        self,
        node_name: str | None = None,
        *,
        on_groups_changed: Callable[[set[PodGroup], set[PodKey] | None], None] | None = None,
    ) -> None:
        super().__init__()
        self.node_name = node_name
        # Told every group a pod or namespace update changed (members, or their
        # addresses or ports), so that a publisher knows what to write again.
        self.on_groups_changed = on_groups_changed
        self.groups = PodGroups(self.store)
        self._local: set[PodKey] = set()
        self.addresses = AddressOwnership(self.store, self._local)
        # Every pod's addresses as datapath peers, shared by every rule that has the pod.
        self._pod_peers: dict[PodKey, tuple[PeerCIDR, ...]] = {}
        self._compiled: dict[PolicyKey, CompiledPolicy] = {}

    def _handlers(self) -> dict[type, KindHandlers[frozenset[PodKey]]]:
        store = self.store
        return {
            Pod: KindHandlers(
                self.upsert_pod,
                lambda pod: self.delete_pod(pod.key),
                store.all_pods,
                lambda pod: pod.key,
            ),
            NetworkPolicy: KindHandlers(
                self.upsert_policy,
                lambda policy: self.delete_policy(policy.key),
                lambda: list(store.policies.values()),
                lambda policy: policy.key,
            ),
            Namespace: KindHandlers(
                self.upsert_namespace,
                lambda namespace: self.delete_namespace(namespace.name),
                lambda: list(store.namespaces.values()),
                lambda namespace: namespace.name,
            ),
            Service: KindHandlers(
                self.upsert_service,
                lambda service: self.delete_service(service.key),
                lambda: list(store.services.values()),
                lambda service: service.key,
            ),
        }

    def rebuilt(self) -> PolicyIndex:
        """A fresh index fed every object this one holds, as a restarted agent would
        be: what incremental updates must equal."""
        fresh = type(self)(self.node_name)
        for namespace in self.store.namespaces.values():
            fresh.upsert_namespace(namespace)
        for pod in self.store.all_pods():
            fresh.upsert_pod(pod)
        for policy in self.store.policies.values():
            fresh.upsert_policy(policy)
        for service in self.store.services.values():
            fresh.upsert_service(service)
        return fresh

    # Reading.

    def is_local(self, pod: Pod) -> bool:
        return not pod.host_network and self.node_name in (None, pod.node_name)

    def local_pods(self) -> frozenset[PodKey]:
        return frozenset(self._local)

    def selecting_policies(self, pod: Pod) -> list[PolicyKey]:
        """Policies of the pod's namespace whose podSelector selects it, by name."""
        if pod.host_network:
            return []
        return sorted(
            key
            for key in self.store.policies_in(pod.namespace)
            if pod.key in self.groups.members(target_group(self.store.policies[key]))
        )

    # Updates.

    def upsert_pod(self, pod: Pod) -> frozenset[PodKey]:
        old = self.store.pod(pod.key)
        if old == pod:
            return NOTHING
        new_namespace = not self.store.namespace_exists(pod.namespace)
        self.store.put_pod(pod)
        was_local = pod.key in self._local
        if self.is_local(pod):
            self._local.add(pod.key)
        else:
            self._local.discard(pod.key)
        self._pod_peers[pod.key] = self._peers_owned(pod)
        changed = self.groups.namespace_changed(pod.namespace) if new_namespace else set()
        changed |= self.groups.pod_changed(old, pod)
        moved = {pod.key}
        # Pods that claim the same addresses: their share of them may change.
        contenders = self.addresses.contenders(pod.key, (old.ips if old else ()) + pod.ips)
        changed |= self._readdress(contenders, moved)
        affected = self._users_of(changed, moved)
        if old is not None and was_local:
            affected.add(pod.key)  # its labels, addresses or ports changed
        if pod.key in self._local:
            affected.add(pod.key)
        return self._invalidate(affected)

    def delete_pod(self, key: PodKey) -> frozenset[PodKey]:
        old = self.store.remove_pod(key)
        if old is None:
            return NOTHING
        changed = self.groups.pod_changed(old, None)
        if not self.store.namespace_exists(key[0]):
            changed |= self.groups.namespace_changed(key[0])
        self._pod_peers.pop(key, None)
        moved = {key}
        changed |= self._readdress(self.addresses.contenders(key, old.ips), moved)
        affected = self._users_of(changed, moved)
        if key in self._local:
            self._local.discard(key)
            affected.add(key)
        return self._invalidate(affected)

    # Addresses two pods claim: ``cni.policy.ownership`` says who holds which.

    def _peers_owned(self, pod: Pod) -> tuple[PeerCIDR, ...]:
        return pod_peers(self.addresses.peer_view(pod))

    def peer_view(self, pod: Pod) -> Pod:
        """The pod with only the addresses it holds alone (what peers see of it)."""
        return self.addresses.peer_view(pod)

    def _readdress(self, keys: set[PodKey], moved: set[PodKey]) -> set[PodGroup]:
        """Recompute these pods' peers; the groups holding those that changed."""
        changed: set[PodGroup] = set()
        for key in keys:
            pod = self.store.pod(key)
            if pod is None:
                continue
            peers = self._peers_owned(pod)
            if peers != self._pod_peers.get(key):
                self._pod_peers[key] = peers
                changed |= self.groups.readdressed(pod)
                moved.add(key)
                if key in self._local:
                    self._resolved.pop(key, None)
        return changed

    def upsert_policy(self, policy: NetworkPolicy) -> frozenset[PodKey]:
        old = self.store.policies.get(policy.key)
        if old == policy:
            return NOTHING
        affected = self._local_targets(old) if old is not None else set()
        self.store.put_policy(policy)
        self._swap_groups(policy.key, old, policy)
        affected |= self._local_targets(policy)
        return self._invalidate(affected)

    def delete_policy(self, key: PolicyKey) -> frozenset[PodKey]:
        old = self.store.policies.get(key)
        if old is None:
            return NOTHING
        affected = self._local_targets(old)
        self._swap_groups(key, old, None)
        self.store.remove_policy(key)
        return self._invalidate(affected)

    def upsert_namespace(self, namespace: Namespace) -> frozenset[PodKey]:
        if self.store.namespaces.get(namespace.name) == namespace:
            return NOTHING
        self.store.namespaces[namespace.name] = namespace
        return self._invalidate(self._users_of(self.groups.namespace_changed(namespace.name)))

    def delete_namespace(self, name: str) -> frozenset[PodKey]:
        """Forget the Namespace object; its pods (if any remain) keep an implicit one."""
        if self.store.namespaces.pop(name, None) is None:
            return NOTHING
        return self._invalidate(self._users_of(self.groups.namespace_changed(name)))

    def upsert_service(self, service: Service) -> frozenset[PodKey]:
        """Services change no pod's rules (see ``service_ips``)."""
        self.store.services[service.key] = service
        return NOTHING

    def delete_service(self, key: ServiceKey) -> frozenset[PodKey]:
        self.store.services.pop(key, None)
        return NOTHING

    def _swap_groups(
        self, key: PolicyKey, old: NetworkPolicy | None, new: NetworkPolicy | None
    ) -> None:
        """Move a policy's use of groups from its old version to its new one (None:
        absent); groups that both use stay resolved."""
        self._compiled.pop(key, None)
        for role, uses in _GROUP_USES:
            before = uses(old) if old is not None else set()
            after = uses(new) if new is not None else set()
            for group in after - before:
                self.groups.acquire(group, key, role)
            for group in before - after:
                self.groups.release(group, key, role)

    def _local_targets(self, policy: NetworkPolicy) -> set[PodKey]:
        return self._local & self.groups.members(target_group(policy))

    def _users_of(self, changed: set[PodGroup], pods: set[PodKey] | None = None) -> set[PodKey]:
        """Local pods selected by policies that read a changed group; those
        policies are compiled again when next needed. ``pods``: the pods whose
        membership or addresses changed (None: many, a namespace's)."""
        if changed and self.on_groups_changed is not None:
            self.on_groups_changed(changed, pods)
        affected: set[PodKey] = set()
        for group in changed:
            for key in self.groups.peer_users(group):
                self._compiled.pop(key, None)
                affected |= self._local_targets(self.store.policies[key])
        return affected

    # Peers, for compiling (rules.PeerSource).

    def pod_peers(self, pod: Pod) -> tuple[PeerCIDR, ...]:
        return self._pod_peers[pod.key]

    def members(self, group: PodGroup) -> set[PodKey]:
        return self.groups.members(group)

    def pods_of(self, keys: Iterable[PodKey]) -> list[Pod]:
        pods = (self.store.pod(key) for key in sorted(keys))
        return [pod for pod in pods if pod is not None]

    def group_pods(self, group: PodGroup) -> list[Pod]:
        pods = map(self.store.pod, self.groups.ordered_members(group))
        return [pod for pod in pods if pod is not None]

    def peers_of(self, keys: set[PodKey]) -> tuple[PeerCIDR, ...]:
        return self._peers_in_order(sorted(keys))

    def _peers_in_order(self, keys: list[PodKey]) -> tuple[PeerCIDR, ...]:
        # The hot path of a broad selector's change: C-level iteration only.
        return tuple(chain.from_iterable(map(self._pod_peers.__getitem__, keys)))

    def group_peers(
        self, group: PodGroup, extra: tuple[PeerCIDR, ...] = ()
    ) -> tuple[PeerCIDR, ...]:
        derived = self.groups.derived(group)
        peers = derived.get(("peers", extra))
        if peers is None:
            own = self._peers_in_order(self.groups.ordered_members(group))
            peers = derived[("peers", extra)] = own + extra
        return cast(tuple[PeerCIDR, ...], peers)

    def named_allows(self, group: PodGroup, named: NamedPorts) -> tuple[AllowRule, ...]:
        derived = self.groups.derived(group)
        allows = derived.get(named)
        if allows is None:
            allows = derived[named] = named_allows(self.group_pods(group), named, self.pod_peers)
        return cast(tuple[AllowRule, ...], allows)

    def compiled(self, key: PolicyKey) -> CompiledPolicy:
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = compile_policy(self.store.policies[key], self)
        return compiled

    # Resolving.

    def incomplete(self, key: PodKey) -> str | None:
        """Never anything here: this index holds every input itself (see
        ``cni.policy.published.index`` for one that does not)."""
        return None

    def caches(self, key: PodKey) -> bool:
        return key in self._local


def _target_groups(policy: NetworkPolicy) -> set[PodGroup]:
    return {target_group(policy)}


_GROUP_USES: tuple[tuple[Role, Callable[[NetworkPolicy], set[PodGroup]]], ...] = (
    ("target", _target_groups),
    ("peer", peer_groups),
)


class GroupIndex(PolicyIndex):
    """An index with no pod of its own: it keeps every selector's group of pods current
    for a publisher (``on_groups_changed``: the controller, which publishes the groups
    and resolves no pod itself)."""

    def is_local(self, pod: Pod) -> bool:
        return False
