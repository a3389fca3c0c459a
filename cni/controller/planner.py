"""The writes and deletions that bring what is published (``Ledger``) to what the
cluster's objects imply (``DesiredState``).

A plan takes what changed (``Changes``) and compares with what is published: only
an object whose content or labels differ is written. Deletions come last in a
plan, and only of what the plan recomputed or what belongs to nothing that exists
(a policy, set or node the synced caches do not know).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cni.controller.desired import DesiredState
from cni.controller.ledger import Ledger, ObjectKey
from cni.controller.sharding import shard_count
from cni.policy.model import Pod, PodKey, PolicyKey
from cni.policy.published.identity import ShardInfo
from cni.policy.published.names import ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS, spec_hash
from cni.policy.published.render import (
    address_set_object,
    policy_endpoints_object,
    policy_targets_object,
)
from cni.policy.published.sets import AddressSetKey
from cni.policy.published.shards import TargetEntry

ADDRESS_SET_CAPACITY = 200  # pods per AddressSet shard: a rewrite sends ~10 KB
TARGETS_CAPACITY = 250  # pods per PolicyTargets shard (a node runs 110 by default)


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


class Planner:
    """Plans from ``desired.changes``, and marks there what is to be planned again: an
    object changed behind its back (``recheck``), a write or deletion that failed
    (``replan``), or everything (``recompute_everything``)."""

    def __init__(
        self,
        desired: DesiredState,
        ledger: Ledger,
        capacity: int = ADDRESS_SET_CAPACITY,
        targets_capacity: int = TARGETS_CAPACITY,
    ) -> None:
        self.desired = desired
        self.ledger = ledger
        self.capacity = capacity
        self.targets_capacity = targets_capacity

    def pending(self) -> bool:
        """Whether the next plan has something to look at."""
        return bool(self.desired.changes) or bool(self.ledger.foreign())

    def plan(self) -> Plan:
        """The writes and deletions that make the published objects what they should be
        now; clears what changed. Writes back what fails with ``replan``."""
        plan = Plan()
        changes = self.desired.changes.take()
        for key, pods in changes.sets.items():
            self._plan_set(plan, key, pods)
        for key, set_id in changes.retired.items():
            if self.desired.sets.get(key) is None:
                plan.deletions += self.ledger.shards(ADDRESS_SET, "", set_id)
        for policy in sorted(changes.policies):
            self._plan_policy(plan, policy)
        for node in sorted(changes.nodes):
            self._plan_targets(plan, node)
        if changes.sweep:
            plan.deletions += self._orphans()
        plan.deletions += self.ledger.foreign()
        seen: set[ObjectKey] = set()
        unique = []
        for deletion in plan.deletions:
            if deletion.object_key not in seen:
                seen.add(deletion.object_key)
                unique.append(deletion)
        plan.deletions = unique
        return plan

    def recheck(self, info: ShardInfo) -> None:
        """Plan the set of an object that changed behind our back again (a no-op when
        it is what the plan would write)."""
        changes = self.desired.changes
        if info.kind == POLICY_ENDPOINTS:
            changes.policy((info.set_namespace, info.set_name))
        elif info.kind == POLICY_TARGETS:
            changes.node(info.set_name)
        else:
            key = self.desired.sets.key_of(info.set_name)
            if key is not None:
                changes.whole_set(key)

    def replan(self, write_or_deletion: Write | ShardInfo) -> None:
        """A write or deletion failed (a conflict, or the API is away): plan its set again."""
        changes = self.desired.changes
        if isinstance(write_or_deletion, ShardInfo):
            kind, namespace, set_name = write_or_deletion.set_key
        else:
            kind, namespace, set_name = _set_of_write(write_or_deletion)
        if kind == POLICY_ENDPOINTS:
            changes.policy((namespace, set_name))
        elif kind == POLICY_TARGETS:
            changes.node(set_name)
        else:
            key = self.desired.sets.key_of(set_name)
            if key is not None:
                changes.whole_set(key)
            else:
                changes.sweep = True  # a set nobody uses: the sweep deletes it

    def recompute_everything(self) -> None:
        """Plan every object again, and sweep what belongs to nothing: a new leader's
        first plan, made once its caches have synced."""
        changes = self.desired.changes
        changes.policies |= self.desired.policies()
        changes.policies |= {
            (info.set_namespace, info.set_name) for info in self.ledger.of_kind(POLICY_ENDPOINTS)
        }
        for address_set in self.desired.sets:
            changes.whole_set(address_set.key)
        changes.nodes |= self.desired.targets.nodes()
        changes.nodes |= {info.set_name for info in self.ledger.of_kind(POLICY_TARGETS)}
        changes.sweep = True

    def _plan_set(self, plan: Plan, key: AddressSetKey, changed: set[PodKey] | None) -> None:
        state = self.desired.sets.get(key)
        if state is None:
            return  # retired: deleted in plan
        admitted = self.desired.set_members(key)
        hashes = [self.desired.placement(pod.key) for pod in admitted]
        current = state.shards or self.ledger.shard_count(ADDRESS_SET, "", state.id)
        count = shard_count(hashes, self.capacity, current)
        if count != state.shards:
            state.shards = count
            changed = None  # every shard, with its new count
        if changed is None:
            indices: Iterable[int] = range(count)
        else:
            indices = {self.desired.placement(pod) % count for pod in changed}
        wanted = set(indices)
        by_shard: dict[int, list[Pod]] = {index: [] for index in wanted}
        for pod, h in zip(admitted, hashes, strict=True):
            shard = by_shard.get(h % count)
            if shard is not None:
                shard.append(pod)
        nodes = sorted(state.nodes)
        for index in sorted(wanted):
            pods = sorted(by_shard[index], key=lambda pod: pod.key)
            body = address_set_object(key, index, count, pods, nodes)
            self._plan_write(plan, ADDRESS_SET, body)
        if changed is None:
            plan.deletions += [
                info
                for info in self.ledger.shards(ADDRESS_SET, "", state.id)
                if info.index >= count
            ]

    def _plan_policy(self, plan: Plan, key: PolicyKey) -> None:
        record = self.desired.record(key)
        if record is None:
            plan.deletions += self.ledger.shards(POLICY_ENDPOINTS, key[0], key[1])
            return
        set_ids = self.desired.sets.ids_of(key)
        nodes = self.desired.targets.nodes_of(key)
        body = policy_endpoints_object(record.policy, record.uid, record.generation, set_ids, nodes)
        self._plan_write(plan, POLICY_ENDPOINTS, body)

    def _plan_targets(self, plan: Plan, node: str) -> None:
        targets = self.desired.targets
        pods = targets.pods_on(node)
        published = self.ledger.shards(POLICY_TARGETS, "", node)
        if not pods:
            plan.deletions += published
            return
        hashes = [self.desired.placement(pod) for pod in pods]
        current = published[0].count if published else 0
        count = shard_count(hashes, self.targets_capacity, current)
        entries: list[list[TargetEntry]] = [[] for _ in range(count)]
        for pod, h in zip(pods, hashes, strict=True):
            selection = targets.selection(pod)
            entries[h % count].append(TargetEntry(pod, selection.uid, selection.policies))
        for index in range(count):
            body = policy_targets_object(node, index, count, entries[index])
            self._plan_write(plan, POLICY_TARGETS, body)
        plan.deletions += [info for info in published if info.index >= count]

    def _plan_write(self, plan: Plan, kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        labels = body["metadata"]["labels"]
        published = self.ledger.get((kind, name))
        if published is None:
            plan.writes.append(Write(kind, name, body, "create"))
            return
        if published.content != spec_hash(body["spec"]):
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

    def _orphans(self) -> list[ShardInfo]:
        """Published objects of no policy, set or node the caches know."""
        set_ids = {address_set.id for address_set in self.desired.sets}
        orphans = []
        for info in self.ledger.all():
            if info.kind == POLICY_ENDPOINTS:
                gone = self.desired.record((info.set_namespace, info.set_name)) is None
            elif info.kind == ADDRESS_SET:
                gone = info.set_name not in set_ids
            else:
                gone = not self.desired.targets.runs_pods(info.set_name)
            if gone:
                orphans.append(info)
        return orphans


def _set_of_write(write: Write) -> tuple[str, str, str]:
    """The set a written object belongs to, as its ``ShardInfo.set_key`` names it."""
    spec = write.body["spec"]
    if write.kind == POLICY_ENDPOINTS:
        return (write.kind, spec["policyNamespace"], spec["policyName"])
    if write.kind == POLICY_TARGETS:
        return (write.kind, "", spec["nodeName"])
    return (write.kind, "", spec["setID"])
