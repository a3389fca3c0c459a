"""The controller's state: the cluster's Namespaces, Pods and NetworkPolicies in, the
objects to publish (``objects``) out, and what changed since the last time.

Selectors are resolved once, by ``PolicyIndex`` (its groups, kept up to date
change by change); ``published.address_sets`` names the sets each policy reads.
This module decides, for each change, what must be written again:

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

``plan`` turns what changed into writes, comparing with what is published (the
controller's informers on its own objects feed ``observe``/``forget``): only an
object whose content or labels differ is written. Deletions come last in a
plan, and only of what the plan recomputed or what belongs to nothing that
exists (a policy, set or node the synced caches do not know).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cni.controller.sharding import placement_hash, shard_count
from cni.policy.kinds import ByKind, KindHandlers
from cni.policy.model import Namespace, NetworkPolicy, Pod, PodKey, PolicyKey
from cni.policy.published import objects
from cni.policy.published.objects import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    ShardInfo,
    TargetEntry,
)
from cni.policy.published.sets import AddressSetKey, address_sets
from cni.policy.resolve import PolicyIndex
from cni.policy.selectors import PodGroup, target_group

log = logging.getLogger("sluice.k8s")

ADDRESS_SET_CAPACITY = 200  # pods per AddressSet shard: a rewrite sends ~10 KB
TARGETS_CAPACITY = 250  # pods per PolicyTargets shard (a node runs 110 by default)

ObjectKey = tuple[str, str]  # (kind, name): every kind is cluster-scoped
SetKey = tuple[str, str, str]  # (kind, namespace, set name)


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A NetworkPolicy with what its PolicyEndpoints record of it: uid and generation."""

    policy: NetworkPolicy
    uid: str
    generation: int


@dataclass(frozen=True)
class Write:
    """Create or replace an object (``body``), or only set its labels (``relabel``)."""

    kind: str
    name: str
    body: dict[str, Any]
    verb: str  # "create", "replace" or "relabel"
    resource_version: str = ""
    labels_patch: dict[str, str | None] = field(default_factory=dict)

    @property
    def key(self) -> ObjectKey:
        return (self.kind, self.name)


@dataclass
class Plan:
    writes: list[Write] = field(default_factory=list)  # in order: sets, policies, targets
    deletions: list[ShardInfo] = field(default_factory=list)  # after every write

    def __bool__(self) -> bool:
        return bool(self.writes or self.deletions)


@dataclass(eq=False)
class _AddressSet:
    key: AddressSetKey
    id: str
    users: set[PolicyKey] = field(default_factory=set)
    nodes: Counter[str] = field(default_factory=Counter)  # node -> users selecting a pod there
    count: int = 0  # shards; 0 until first planned


@dataclass(frozen=True)
class _Selection:
    """What the node's PolicyTargets say about a pod."""

    node: str
    uid: str
    policies: tuple[str, ...]


class Publisher:
    def __init__(
        self,
        capacity: int = ADDRESS_SET_CAPACITY,
        targets_capacity: int = TARGETS_CAPACITY,
    ) -> None:
        self.capacity = capacity
        self.targets_capacity = targets_capacity
        self.index = PolicyIndex(local=False, on_groups_changed=self._groups_changed)
        self._meta: dict[PolicyKey, tuple[str, int]] = {}  # uid, generation
        self._sets: dict[AddressSetKey, _AddressSet] = {}
        self._set_by_id: dict[str, AddressSetKey] = {}
        self._sets_of_group: dict[PodGroup, set[AddressSetKey]] = {}
        self._policy_sets: dict[PolicyKey, tuple[AddressSetKey, ...]] = {}
        self._selected: dict[PodKey, _Selection] = {}
        self._node_pods: dict[str, set[PodKey]] = {}
        self._policy_targets: dict[PolicyKey, set[PodKey]] = {}
        self._target_nodes: dict[PolicyKey, Counter[str]] = {}
        self._hashes: dict[PodKey, int] = {}
        # What to plan again. A set's pods, or None for every shard.
        self._dirty_policies: set[PolicyKey] = set()
        self._dirty_sets: dict[AddressSetKey, set[PodKey] | None] = {}
        self._dirty_nodes: set[str] = set()
        self._retired: dict[AddressSetKey, str] = {}  # sets without users, to delete
        self._sweep = False
        # What is published: the controller's view of its own objects.
        self._published: dict[ObjectKey, ShardInfo] = {}
        self._published_sets: dict[SetKey, dict[str, ShardInfo]] = {}
        # Objects of our kinds that are no shard the controller writes (a name their
        # spec does not derive): agents ignore them, and the next plan deletes them.
        self._foreign: dict[ObjectKey, ShardInfo] = {}
        self.kinds: ByKind[None] = ByKind(self._handlers(), lambda _: None, "the publisher")

    # -- inputs, by kind ---------------------------------------------------------------------

    def _handlers(self) -> dict[type, KindHandlers[None]]:
        def published(kind: str) -> KindHandlers[None]:
            return KindHandlers(
                self.observe, self.forget, replace=lambda infos: self.replace_published(kind, infos)
            )

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
            **{info_type: published(kind) for kind, info_type in objects.INFO_TYPES.items()},
        }

    def upsert(self, obj: Any) -> None:
        self.kinds.upsert(obj)

    def delete(self, obj: Any) -> None:
        self.kinds.delete(obj)

    def replace_all(self, kind: type, items: Iterable[Any]) -> None:
        self.kinds.replace_all(kind, items)

    def put_namespace(self, namespace: Namespace) -> None:
        self.index.upsert_namespace(namespace)

    def remove_namespace(self, name: str) -> None:
        self.index.delete_namespace(name)

    def put_pod(self, pod: Pod) -> None:
        self.index.upsert_pod(pod)
        self._retarget(pod.key)

    def remove_pod(self, key: PodKey) -> None:
        self.index.delete_pod(key)
        self._retarget(key)
        self._hashes.pop(key, None)

    def put_policy(self, policy: NetworkPolicy, uid: str, generation: int) -> None:
        key = policy.key
        old_meta = self._meta.get(key)
        self._meta[key] = (uid, generation)
        if self.index.policy(key) == policy and old_meta == (uid, generation):
            return
        self.index.upsert_policy(policy)
        self._use_sets(key, address_sets(policy))
        selects = self.index.groups.members(target_group(policy))
        for pod in self._policy_targets.get(key, set()) | selects:
            self._retarget(pod)
        self._dirty_policies.add(key)

    def remove_policy(self, key: PolicyKey) -> None:
        if self.index.policy(key) is None:
            return
        self.index.delete_policy(key)
        self._meta.pop(key, None)
        self._use_sets(key, ())
        for pod in set(self._policy_targets.get(key, ())):
            self._retarget(pod)
        self._dirty_policies.add(key)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        pods = list(pods)
        wanted = {pod.key for pod in pods}
        for gone in [p.key for p in self.index.store.all_pods() if p.key not in wanted]:
            self.remove_pod(gone)
        for pod in pods:
            self.put_pod(pod)

    def replace_namespaces(self, namespaces: Iterable[Namespace]) -> None:
        self.index.replace_all(Namespace, namespaces)

    def replace_policies(self, policies: Iterable[tuple[NetworkPolicy, str, int]]) -> None:
        policies = list(policies)
        wanted = {policy.key for policy, _, _ in policies}
        for gone in [key for key in self.index.store.policies if key not in wanted]:
            self.remove_policy(gone)
        for policy, uid, generation in policies:
            self.put_policy(policy, uid, generation)

    # -- what is published -----------------------------------------------------------------

    def observe(self, info: ShardInfo) -> None:
        """An object of ours as the API has it now (listed, watched, or just written).
        A change the plan did not make (someone edited or deleted it) is planned again;
        an object that is no shard of ours is deleted (``_foreign``)."""
        if info.foreign and info.name != info.derived_name:
            log.warning("deleting %s %s: %s", info.kind, info.name, info.foreign)
            self._forget_published(info)
            self._foreign[info.object_key] = info
            return
        self._foreign.pop(info.object_key, None)
        old = self._published.get(info.object_key)
        self._published[info.object_key] = info
        self._published_sets.setdefault(info.set_key, {})[info.name] = info
        if old is not None and old.resource_version == info.resource_version:
            return
        self._recheck(info)

    def forget(self, info: ShardInfo) -> None:
        """An object of ours is gone."""
        self._foreign.pop(info.object_key, None)
        if self._forget_published(info):
            self._recheck(info)

    def _forget_published(self, info: ShardInfo) -> bool:
        old = self._published.pop(info.object_key, None)
        if old is None:
            return False
        shards = self._published_sets.get(old.set_key)
        if shards is not None:
            shards.pop(old.name, None)
            if not shards:
                del self._published_sets[old.set_key]
        return True

    def replace_published(self, kind: str, infos: Iterable[ShardInfo]) -> None:
        held = [*self._published.items(), *self._foreign.items()]
        for old in [info for key, info in held if key[0] == kind]:
            self.forget(old)
        for info in infos:
            self.observe(info)

    def _recheck(self, info: ShardInfo) -> None:
        """Plan the set of an object that changed behind our back again (a no-op when
        it is what the plan would write)."""
        if info.kind == POLICY_ENDPOINTS:
            self._dirty_policies.add((info.set_namespace, info.set_name))
        elif info.kind == POLICY_TARGETS:
            self._dirty_nodes.add(info.set_name)
        else:
            key = self._set_by_id.get(info.set_name)
            if key is not None:
                self._dirty_sets[key] = None

    def published_count(self) -> int:
        return len(self._published)

    def published_by_kind(self) -> dict[str, int]:
        return dict(Counter(key[0] for key in self._published))

    # -- a term's start ---------------------------------------------------------------------

    def recompute_everything(self) -> None:
        """Plan every object again, and sweep what belongs to nothing: a new leader's
        first plan, made once its caches have synced."""
        self._dirty_policies |= set(self.index.store.policies)
        self._dirty_policies |= {
            (i.set_namespace, i.set_name)
            for k, i in self._published.items()
            if k[0] == POLICY_ENDPOINTS
        }
        for key in self._sets:
            self._dirty_sets[key] = None
        self._dirty_nodes |= set(self._node_pods)
        self._dirty_nodes |= {
            info.set_name for key, info in self._published.items() if key[0] == POLICY_TARGETS
        }
        self._sweep = True

    def pending(self) -> bool:
        return bool(
            self._dirty_policies
            or self._dirty_sets
            or self._dirty_nodes
            or self._sweep
            or self._foreign
        )

    def pending_counts(self) -> dict[str, int]:
        return {
            "policies": len(self._dirty_policies),
            "addressSets": len(self._dirty_sets),
            "nodes": len(self._dirty_nodes),
        }

    def totals(self) -> dict[str, int]:
        return {
            "pods": sum(1 for _ in self.index.store.all_pods()),
            "policies": len(self.index.store.policies),
            "addressSets": len(self._sets),
            "nodes": len(self._node_pods),
        }

    # -- planning ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        """The writes and deletions that make the published objects what they should be
        now; clears what changed. Writes back what fails with ``replan``."""
        plan = Plan()
        dirty_sets, self._dirty_sets = self._dirty_sets, {}
        dirty_policies, self._dirty_policies = self._dirty_policies, set()
        dirty_nodes, self._dirty_nodes = self._dirty_nodes, set()
        sweep, self._sweep = self._sweep, False
        retired, self._retired = self._retired, {}
        for key, pods in dirty_sets.items():
            self._plan_set(plan, key, pods)
        for key, set_id in retired.items():
            if key not in self._sets:
                plan.deletions += self._published_shards(ADDRESS_SET, "", set_id)
        for policy in sorted(dirty_policies):
            self._plan_policy(plan, policy)
        for node in sorted(dirty_nodes):
            self._plan_targets(plan, node)
        if sweep:
            plan.deletions += self._orphans()
        plan.deletions += self._foreign.values()
        seen: set[ObjectKey] = set()
        unique = []
        for deletion in plan.deletions:
            if deletion.object_key not in seen:
                seen.add(deletion.object_key)
                unique.append(deletion)
        plan.deletions = unique
        return plan

    def replan(self, write_or_deletion: Write | ShardInfo) -> None:
        """A write or deletion failed (a conflict, or the API is away): plan its set again."""
        kind = write_or_deletion.kind
        if kind == POLICY_ENDPOINTS:
            if isinstance(write_or_deletion, ShardInfo):
                policy = (write_or_deletion.set_namespace, write_or_deletion.set_name)
            else:
                spec = write_or_deletion.body["spec"]
                policy = (spec["policyNamespace"], spec["policyName"])
            self._dirty_policies.add(policy)
        elif kind == POLICY_TARGETS:
            node = (
                write_or_deletion.set_name
                if isinstance(write_or_deletion, ShardInfo)
                else write_or_deletion.body["spec"]["nodeName"]
            )
            self._dirty_nodes.add(node)
        else:
            set_id = (
                write_or_deletion.set_name
                if isinstance(write_or_deletion, ShardInfo)
                else write_or_deletion.body["spec"]["setID"]
            )
            key = self._set_by_id.get(set_id)
            if key is not None:
                self._dirty_sets[key] = None
            else:
                self._sweep = True  # a set nobody uses: the sweep deletes it

    def _plan_set(self, plan: Plan, key: AddressSetKey, changed: set[PodKey] | None) -> None:
        state = self._sets.get(key)
        if state is None:
            return  # retired: deleted below
        group_members = self.index.groups.members(key.group)
        # Each pod with the addresses it holds alone (see PolicyIndex.peer_view).
        views = (self.index.peer_view(p) for p in map(self.index.store.pod, group_members) if p)
        admitted = [pod for pod in views if key.admits(pod)]
        hashes = [self._hash(pod.key) for pod in admitted]
        current = state.count or self._published_count(ADDRESS_SET, "", state.id)
        count = shard_count(hashes, self.capacity, current)
        if count != state.count:
            state.count = count
            changed = None  # every shard, with its new count
        if changed is None:
            indices: Iterable[int] = range(count)
        else:
            indices = {self._hash(pod) % count for pod in changed}
        wanted = set(indices)
        by_shard: dict[int, list[Pod]] = {index: [] for index in wanted}
        for pod, h in zip(admitted, hashes, strict=True):
            shard = by_shard.get(h % count)
            if shard is not None:
                shard.append(pod)
        nodes = sorted(state.nodes)
        for index in sorted(wanted):
            pods = sorted(by_shard[index], key=lambda pod: pod.key)
            body = objects.address_set_object(key, index, count, pods, nodes)
            self._plan_write(plan, ADDRESS_SET, body)
        if changed is None:
            plan.deletions += [
                info
                for info in self._published_shards(ADDRESS_SET, "", state.id)
                if info.index >= count
            ]

    def _plan_policy(self, plan: Plan, key: PolicyKey) -> None:
        policy = self.index.policy(key)
        if policy is None:
            plan.deletions += self._published_shards(POLICY_ENDPOINTS, key[0], key[1])
            return
        uid, generation = self._meta[key]
        set_ids = [self._sets[set_key].id for set_key in self._policy_sets.get(key, ())]
        nodes = sorted(self._target_nodes.get(key, ()))
        body = objects.policy_endpoints_object(policy, uid, generation, set_ids, nodes)
        self._plan_write(plan, POLICY_ENDPOINTS, body)

    def _plan_targets(self, plan: Plan, node: str) -> None:
        pods = sorted(self._node_pods.get(node, ()))
        published = self._published_shards(POLICY_TARGETS, "", node)
        if not pods:
            plan.deletions += published
            return
        hashes = [self._hash(pod) for pod in pods]
        current = published[0].count if published else 0
        count = shard_count(hashes, self.targets_capacity, current)
        entries: list[list[TargetEntry]] = [[] for _ in range(count)]
        for pod, h in zip(pods, hashes, strict=True):
            selection = self._selected[pod]
            entries[h % count].append(TargetEntry(pod, selection.uid, selection.policies))
        for index in range(count):
            body = objects.policy_targets_object(node, index, count, entries[index])
            self._plan_write(plan, POLICY_TARGETS, body)
        plan.deletions += [info for info in published if info.index >= count]

    def _plan_write(self, plan: Plan, kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        labels = body["metadata"]["labels"]
        published = self._published.get((kind, name))
        if published is None:
            plan.writes.append(Write(kind, name, body, "create"))
            return
        if published.content != objects.spec_hash(body["spec"]):
            body["metadata"]["resourceVersion"] = published.resource_version
            plan.writes.append(Write(kind, name, body, "replace", published.resource_version))
            return
        have = dict(published.labels)
        if have != labels:
            patch: dict[str, str | None] = {k: v for k, v in labels.items() if have.get(k) != v}
            patch.update({k: None for k in have if k not in labels})
            plan.writes.append(
                Write(kind, name, body, "relabel", published.resource_version, patch)
            )

    def _published_shards(self, kind: str, namespace: str, set_name: str) -> list[ShardInfo]:
        return sorted(
            self._published_sets.get((kind, namespace, set_name), {}).values(),
            key=lambda info: info.index,
        )

    def _published_count(self, kind: str, namespace: str, set_name: str) -> int:
        for info in self._published_shards(kind, namespace, set_name):
            if info.index == 0:
                return info.count
        return 0

    def _orphans(self) -> list[ShardInfo]:
        """Published objects of no policy, set or node the caches know."""
        set_ids = {state.id for state in self._sets.values()}
        orphans = []
        for info in self._published.values():
            if info.kind == POLICY_ENDPOINTS:
                gone = self.index.policy((info.set_namespace, info.set_name)) is None
            elif info.kind == ADDRESS_SET:
                gone = info.set_name not in set_ids
            else:
                gone = info.set_name not in self._node_pods
            if gone:
                orphans.append(info)
        return orphans

    # -- bookkeeping --------------------------------------------------------------------------

    def _hash(self, key: PodKey) -> int:
        h = self._hashes.get(key)
        if h is None:
            h = self._hashes[key] = placement_hash(objects.pod_name(key))
        return h

    def _groups_changed(self, groups: set[PodGroup], pods: set[PodKey] | None) -> None:
        for group in groups:
            for key in self._sets_of_group.get(group, ()):
                dirty = self._dirty_sets.get(key, set())
                if dirty is None:
                    continue
                if pods is None:
                    self._dirty_sets[key] = None  # a namespace changed: many pods
                else:
                    dirty |= pods
                    self._dirty_sets[key] = dirty

    def _use_sets(self, policy: PolicyKey, keys: tuple[AddressSetKey, ...]) -> None:
        """Switch the policy's address sets; node counts move with it."""
        old = self._policy_sets.get(policy, ())
        nodes = list(self._target_nodes.get(policy, ()))
        for key in old:
            if key in keys:
                continue
            state = self._sets[key]
            state.users.discard(policy)
            for node in nodes:
                self._set_node(state, node, -1)
            if not state.users:
                del self._sets[key]
                del self._set_by_id[state.id]
                group_sets = self._sets_of_group[key.group]
                group_sets.discard(key)
                if not group_sets:
                    del self._sets_of_group[key.group]
                self._dirty_sets.pop(key, None)
                self._retired[key] = state.id
        for key in keys:
            if key in old:
                continue
            added = self._sets.get(key)
            if added is None:
                added = self._sets[key] = _AddressSet(key, objects.address_set_id(key))
                self._set_by_id[added.id] = key
                self._sets_of_group.setdefault(key.group, set()).add(key)
                self._retired.pop(key, None)
                self._dirty_sets[key] = None
            added.users.add(policy)
            for node in nodes:
                self._set_node(added, node, +1)
        if keys:
            self._policy_sets[policy] = keys
        else:
            self._policy_sets.pop(policy, None)

    def _set_node(self, state: _AddressSet, node: str, step: int) -> None:
        before = state.nodes[node]
        state.nodes[node] = before + step
        if state.nodes[node] <= 0:
            del state.nodes[node]
        if (before == 0) != (state.nodes.get(node, 0) == 0):
            self._dirty_sets[state.key] = None  # labels of every shard

    def _retarget(self, key: PodKey) -> None:
        """Bring the pod's PolicyTargets entry, and the node counts of the policies
        that select it, up to date."""
        pod = self.index.store.pod(key)
        old = self._selected.get(key)
        new = None
        if pod is not None and pod.node_name and not pod.host_network:
            names = tuple(name for _, name in self.index.selecting_policies(pod))
            new = _Selection(pod.node_name, pod.uid, names)
        if new == old:
            return
        namespace = key[0]
        if old is not None:
            self._dirty_nodes.add(old.node)
            pods = self._node_pods[old.node]
            pods.discard(key)
            if not pods:
                del self._node_pods[old.node]
            for name in old.policies:
                self._target_node((namespace, name), old.node, -1)
                targets = self._policy_targets[(namespace, name)]
                targets.discard(key)
                if not targets:
                    del self._policy_targets[(namespace, name)]
            del self._selected[key]
        if new is not None:
            self._dirty_nodes.add(new.node)
            self._node_pods.setdefault(new.node, set()).add(key)
            for name in new.policies:
                self._target_node((namespace, name), new.node, +1)
                self._policy_targets.setdefault((namespace, name), set()).add(key)
            self._selected[key] = new

    def _target_node(self, policy: PolicyKey, node: str, step: int) -> None:
        counts = self._target_nodes.setdefault(policy, Counter())
        before = counts[node]
        counts[node] = before + step
        if counts[node] <= 0:
            del counts[node]
        if not counts:
            del self._target_nodes[policy]
        if (before == 0) == (counts.get(node, 0) == 0):
            return
        # The policy gained its first or lost its last selected pod on the node.
        self._dirty_policies.add(policy)
        for key in self._policy_sets.get(policy, ()):
            self._set_node(self._sets[key], node, step)
