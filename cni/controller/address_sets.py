"""The address sets the policies read: for each, the policies that read it (its users)
and the nodes it is labelled for (where a user selects a pod).

A set exists while a policy reads it; its id names its published objects. A node
label is on a set while at least one of its users selects a pod on that node: the
counts move with the policies' targets (``policy_node``) and with the policies
that start or stop reading the set (``use``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from cni.controller.changes import Changes
from cni.policy.model import PodKey, PolicyKey
from cni.policy.published.names import address_set_id
from cni.policy.published.sets import AddressSetKey
from cni.policy.selectors import PodGroup


@dataclass(eq=False)
class AddressSet:
    """One set in use. ``shards`` is the planner's: the count it last planned, kept
    here so that it goes with the set (a set made anew starts from what is published)."""

    key: AddressSetKey
    id: str
    users: set[PolicyKey] = field(default_factory=set)
    nodes: Counter[str] = field(default_factory=Counter)  # node -> users selecting a pod there
    shards: int = 0  # 0 until first planned


class AddressSets:
    """The sets in use, found by key, by id, by the group of pods they draw from, and by
    the policy that reads them; marks in ``changes`` the sets to write or delete."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self._sets: dict[AddressSetKey, AddressSet] = {}
        self._by_id: dict[str, AddressSetKey] = {}
        self._by_group: dict[PodGroup, set[AddressSetKey]] = {}
        self._of_policy: dict[PolicyKey, tuple[AddressSetKey, ...]] = {}

    def __len__(self) -> int:
        return len(self._sets)

    def __iter__(self) -> Iterator[AddressSet]:
        return iter(self._sets.values())

    def get(self, key: AddressSetKey) -> AddressSet | None:
        return self._sets.get(key)

    def key_of(self, set_id: str) -> AddressSetKey | None:
        return self._by_id.get(set_id)

    def ids_of(self, policy: PolicyKey) -> list[str]:
        """The ids of the sets the policy reads, in its order."""
        return [self._sets[key].id for key in self._of_policy.get(policy, ())]

    def use(self, policy: PolicyKey, keys: tuple[AddressSetKey, ...], nodes: Iterable[str]) -> None:
        """Make ``keys`` the sets the policy reads; ``nodes`` are those it selects pods
        on, whose labels move with it."""
        old = self._of_policy.get(policy, ())
        nodes = list(nodes)
        for key in old:
            if key in keys:
                continue
            state = self._sets[key]
            state.users.discard(policy)
            for node in nodes:
                self._count_node(state, node, -1)
            if not state.users:
                self._drop(state)
        for key in keys:
            if key in old:
                continue
            added = self._sets.get(key)
            if added is None:
                added = self._add(key)
            added.users.add(policy)
            for node in nodes:
                self._count_node(added, node, +1)
        if keys:
            self._of_policy[policy] = keys
        else:
            self._of_policy.pop(policy, None)

    def policy_node(self, policy: PolicyKey, node: str, step: int) -> None:
        """The policy selects its first pod on the node (+1), or no longer any (-1)."""
        for key in self._of_policy.get(policy, ()):
            self._count_node(self._sets[key], node, step)

    def groups_changed(self, groups: Iterable[PodGroup], pods: set[PodKey] | None) -> None:
        """Members of these groups changed: ``pods``, or (None) too many to tell."""
        for group in groups:
            for key in self._by_group.get(group, ()):
                if pods is None:
                    self.changes.whole_set(key)  # a namespace changed: many pods
                else:
                    self.changes.set_pods(key, pods)

    def _add(self, key: AddressSetKey) -> AddressSet:
        added = self._sets[key] = AddressSet(key, address_set_id(key))
        self._by_id[added.id] = key
        self._by_group.setdefault(key.group, set()).add(key)
        self.changes.revive_set(key)
        return added

    def _drop(self, state: AddressSet) -> None:
        key = state.key
        del self._sets[key]
        del self._by_id[state.id]
        group_sets = self._by_group[key.group]
        group_sets.discard(key)
        if not group_sets:
            del self._by_group[key.group]
        self.changes.retire_set(key, state.id)

    def _count_node(self, state: AddressSet, node: str, step: int) -> None:
        before = state.nodes[node]
        state.nodes[node] = before + step
        if state.nodes[node] <= 0:
            del state.nodes[node]
        if (before == 0) != (state.nodes.get(node, 0) == 0):
            self.changes.whole_set(state.key)  # labels of every shard
