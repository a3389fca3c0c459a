"""The cluster's Namespaces, Pods and NetworkPolicies, and what they imply the
controller publishes: the address sets each policy reads (``AddressSets``), the
pods each node's PolicyTargets list and the nodes each policy selects pods on
(``Targets``), and what changed since the last plan (``Changes``).

Selectors are resolved once, by ``GroupIndex`` (its groups, kept up to date
change by change). For each change, what must be written again:

- a pod's update touches, in every address set whose group it changed (joined,
  left, new addresses or ports), the one shard that holds it; and its node's
  PolicyTargets when the policies selecting it, its node or its uid changed;
- a namespace's labels touch the address sets of the namespace selectors it
  starts or stops matching (every shard of those);
- a policy's update rewrites its PolicyEndpoints, starts or stops its use of
  address sets, and retargets the pods it selected or selects;
- a node label (``node.sluice.dev/<node>``) is added to a policy's and its
  sets' objects when the policy gains its first selected pod on that node, and
  removed when it loses its last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cni.controller.address_sets import AddressSets
from cni.controller.changes import Changes
from cni.controller.sharding import placement_hash
from cni.controller.targets import Selection, Targets
from cni.policy.index import GroupIndex
from cni.policy.kinds import KindHandlers
from cni.policy.model import Namespace, NetworkPolicy, Pod, PodKey, PolicyKey
from cni.policy.published.names import pod_name
from cni.policy.published.sets import AddressSetKey, address_sets
from cni.policy.selectors import target_group


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A NetworkPolicy with what its PolicyEndpoints record of it: uid and generation."""

    policy: NetworkPolicy
    uid: str
    generation: int


class DesiredState:
    """The cluster's objects in (``handlers`` by kind, or ``put_*``/``remove_*``), what
    they imply out (``index``, ``sets``, ``targets``), and ``changes`` marked as they
    come."""

    def __init__(self) -> None:
        self.changes = Changes()
        self.sets = AddressSets(self.changes)
        self.targets = Targets(self.changes)
        self.index = GroupIndex(on_groups_changed=self.sets.groups_changed)
        self._meta: dict[PolicyKey, tuple[str, int]] = {}  # uid, generation
        self._hashes: dict[PodKey, int] = {}  # placement_hash of each pod's name

    # -- inputs -------------------------------------------------------------------------------

    def handlers(self) -> dict[type, KindHandlers[None]]:
        return {
            Namespace: KindHandlers(
                self.put_namespace,
                lambda namespace: self.remove_namespace(namespace.name),
                replace=self.replace_namespaces,
            ),
            Pod: KindHandlers(
                self.put_pod, lambda pod: self.remove_pod(pod.key), replace=self.replace_pods
            ),
            PolicyRecord: KindHandlers(
                lambda record: self.put_policy(record.policy, record.uid, record.generation),
                lambda record: self.remove_policy(record.policy.key),
                replace=lambda records: self.replace_policies(
                    (r.policy, r.uid, r.generation) for r in records
                ),
            ),
        }

    def put_namespace(self, namespace: Namespace) -> None:
        self.index.upsert_namespace(namespace)

    def remove_namespace(self, name: str) -> None:
        self.index.delete_namespace(name)

    def replace_namespaces(self, namespaces: Iterable[Namespace]) -> None:
        self.index.replace_all(Namespace, namespaces)

    def put_pod(self, pod: Pod) -> None:
        self.index.upsert_pod(pod)
        self._retarget(pod.key)

    def remove_pod(self, key: PodKey) -> None:
        self.index.delete_pod(key)
        self._retarget(key)
        self._hashes.pop(key, None)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        pods = list(pods)
        wanted = {pod.key for pod in pods}
        for gone in [p.key for p in self.index.store.all_pods() if p.key not in wanted]:
            self.remove_pod(gone)
        for pod in pods:
            self.put_pod(pod)

    def put_policy(self, policy: NetworkPolicy, uid: str, generation: int) -> None:
        key = policy.key
        old_meta = self._meta.get(key)
        self._meta[key] = (uid, generation)
        if self.index.policy(key) == policy and old_meta == (uid, generation):
            return
        self.index.upsert_policy(policy)
        self.sets.use(key, address_sets(policy), self.targets.nodes_of(key))
        selects = self.index.groups.members(target_group(policy))
        for pod in self.targets.pods_of(key) | selects:
            self._retarget(pod)
        self.changes.policy(key)

    def remove_policy(self, key: PolicyKey) -> None:
        if self.index.policy(key) is None:
            return
        self.index.delete_policy(key)
        self._meta.pop(key, None)
        self.sets.use(key, (), self.targets.nodes_of(key))
        for pod in self.targets.pods_of(key):
            self._retarget(pod)
        self.changes.policy(key)

    def replace_policies(self, policies: Iterable[tuple[NetworkPolicy, str, int]]) -> None:
        policies = list(policies)
        wanted = {policy.key for policy, _, _ in policies}
        for gone in [key for key in self.index.store.policies if key not in wanted]:
            self.remove_policy(gone)
        for policy, uid, generation in policies:
            self.put_policy(policy, uid, generation)

    # -- what they imply ----------------------------------------------------------------------

    def record(self, key: PolicyKey) -> PolicyRecord | None:
        policy = self.index.policy(key)
        if policy is None:
            return None
        uid, generation = self._meta[key]
        return PolicyRecord(policy, uid, generation)

    def policies(self) -> set[PolicyKey]:
        return set(self.index.store.policies)

    def set_members(self, key: AddressSetKey) -> list[Pod]:
        """The pods the set lists, each with the addresses it holds alone (see
        ``PolicyIndex.peer_view``), in no particular order."""
        index = self.index
        members = (index.store.pod(member) for member in index.groups.members(key.group))
        views = (index.peer_view(pod) for pod in members if pod)
        return [pod for pod in views if key.admits(pod)]

    def placement(self, pod: PodKey) -> int:
        """The pod's ``placement_hash``, computed once while the pod exists."""
        h = self._hashes.get(pod)
        if h is None:
            h = self._hashes[pod] = placement_hash(pod_name(pod))
        return h

    def totals(self) -> dict[str, int]:
        return {
            "pods": sum(1 for _ in self.index.store.all_pods()),
            "policies": len(self.index.store.policies),
            "addressSets": len(self.sets),
            "nodes": len(self.targets.nodes()),
        }

    # -- bookkeeping --------------------------------------------------------------------------

    def _retarget(self, key: PodKey) -> None:
        """Bring the pod's PolicyTargets entry, and the node counts of the policies
        that select it (and of their sets), up to date."""
        pod = self.index.store.pod(key)
        new = None
        if pod is not None and pod.node_name and not pod.host_network:
            names = tuple(name for _, name in self.index.selecting_policies(pod))
            new = Selection(pod.node_name, pod.uid, names)
        for change in self.targets.select(key, new):
            self.sets.policy_node(*change)
