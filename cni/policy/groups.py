"""Each distinct selector's matching pods, computed once and kept up to date.

A ``PodGroup`` (see ``selectors``) is resolved when the first policy uses it
and dropped when the last one lets go; equal selectors in many policies share
one entry. Namespace selectors are cached the same way (the namespaces they
match), shared by every group that uses them.

Changes are applied, not recomputed: a pod update is tested against the
groups of its namespace and the groups whose namespace selector matches its
namespace only; a namespace label change moves that namespace's pods in or
out of the groups of the namespace selectors it starts or stops matching.
Each update returns the groups it changed, so the caller can tell which
policies (and so which pods' policies) it touched.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from cni.policy.model import LabelSelector, Pod, PodKey, PolicyKey
from cni.policy.selectors import PodGroup, selector_matches
from cni.policy.store import ObjectStore

Role = Literal["peer", "target"]


@dataclass(slots=True, eq=False)
class _Group:
    members: set[PodKey]
    peer_of: set[PolicyKey] = field(default_factory=set)
    target_of: set[PolicyKey] = field(default_factory=set)
    # Values computed from the members (their peers, their named ports), kept
    # until the members or their addresses or ports change.
    derived: dict[Hashable, object] = field(default_factory=dict)
    # The members in key order (sorting 10,000 keys takes milliseconds, a
    # single insertion microseconds); None: sort when next asked.
    ordered: list[PodKey] | None = None

    def add(self, key: PodKey) -> None:
        self.members.add(key)
        if self.ordered is not None:
            bisect.insort(self.ordered, key)

    def remove(self, key: PodKey) -> None:
        self.members.discard(key)
        if self.ordered is not None:
            del self.ordered[bisect.bisect_left(self.ordered, key)]


@dataclass(slots=True, eq=False)
class _NamespaceSelection:
    namespaces: set[str]
    groups: set[PodGroup] = field(default_factory=set)


class PodGroups:
    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._groups: dict[PodGroup, _Group] = {}
        self._by_namespace: dict[str, set[PodGroup]] = {}  # groups with a fixed namespace
        self._selections: dict[LabelSelector, _NamespaceSelection] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def members(self, group: PodGroup) -> set[PodKey]:
        return self._groups[group].members

    def ordered_members(self, group: PodGroup) -> list[PodKey]:
        """The members in key order (do not modify)."""
        state = self._groups[group]
        if state.ordered is None:
            state.ordered = sorted(state.members)
        return state.ordered

    def peer_users(self, group: PodGroup) -> set[PolicyKey]:
        return self._groups[group].peer_of

    def derived(self, group: PodGroup) -> dict[Hashable, object]:
        """A cache for values computed from the group's members; emptied when they change."""
        return self._groups[group].derived

    # Use by policies.

    def acquire(self, group: PodGroup, policy: PolicyKey, role: Role) -> None:
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _Group(self._resolve(group))
        (state.peer_of if role == "peer" else state.target_of).add(policy)

    def release(self, group: PodGroup, policy: PolicyKey, role: Role) -> None:
        state = self._groups[group]
        (state.peer_of if role == "peer" else state.target_of).discard(policy)
        if state.peer_of or state.target_of:
            return
        del self._groups[group]
        if group.namespace is not None:
            fixed = self._by_namespace[group.namespace]
            fixed.discard(group)
            if not fixed:
                del self._by_namespace[group.namespace]
        else:
            assert group.namespace_selector is not None
            selection = self._selections[group.namespace_selector]
            selection.groups.discard(group)
            if not selection.groups:
                del self._selections[group.namespace_selector]

    def _resolve(self, group: PodGroup) -> set[PodKey]:
        if group.namespace is not None:
            self._by_namespace.setdefault(group.namespace, set()).add(group)
            namespaces: Iterable[str] = (group.namespace,)
        else:
            assert group.namespace_selector is not None
            selection = self._selection(group.namespace_selector)
            selection.groups.add(group)
            namespaces = selection.namespaces
        return {
            pod.key
            for namespace in namespaces
            for pod in self._store.pods_in(namespace)
            if selector_matches(group.pod_selector, pod.labels)
        }

    def _selection(self, selector: LabelSelector) -> _NamespaceSelection:
        selection = self._selections.get(selector)
        if selection is None:
            matching = {
                name
                for name in self._store.namespace_names()
                if selector_matches(selector, self._store.namespace_labels(name))
            }
            selection = self._selections[selector] = _NamespaceSelection(matching)
        return selection

    # Updates. Call them after the store holds the new state.

    def pod_changed(self, old: Pod | None, new: Pod | None) -> set[PodGroup]:
        """Groups whose members, or whose members' addresses or ports, changed."""
        pod = new or old
        assert pod is not None
        key = pod.key
        candidates = list(self._by_namespace.get(pod.namespace, ()))
        for selection in self._selections.values():
            if pod.namespace in selection.namespaces:
                candidates.extend(selection.groups)
        # Peers are built from addresses, and egress named ports from ports.
        data_changed = old is None or new is None or old.ips != new.ips or old.ports != new.ports
        changed = set()
        for group in candidates:
            state = self._groups[group]
            was = key in state.members
            now = new is not None and selector_matches(group.pod_selector, new.labels)
            if was != now:
                if now:
                    state.add(key)
                else:
                    state.remove(key)
            elif not (now and data_changed):
                continue
            state.derived.clear()
            changed.add(group)
        return changed

    def readdressed(self, pod: Pod) -> set[PodGroup]:
        """Groups holding ``pod``, whose peers changed though its addresses did not (it
        lost or regained an address another pod claims too)."""
        candidates = list(self._by_namespace.get(pod.namespace, ()))
        for selection in self._selections.values():
            if pod.namespace in selection.namespaces:
                candidates.extend(selection.groups)
        changed = set()
        for group in candidates:
            state = self._groups[group]
            if pod.key in state.members:
                state.derived.clear()
                changed.add(group)
        return changed

    def namespace_changed(self, name: str) -> set[PodGroup]:
        """Groups that gained or lost pods because ``name`` started or stopped
        matching a namespace selector (new labels, or it appeared or vanished)."""
        exists = self._store.namespace_exists(name)
        labels = self._store.namespace_labels(name)
        changed = set()
        for selector, selection in self._selections.items():
            was = name in selection.namespaces
            now = exists and selector_matches(selector, labels)
            if was == now:
                continue
            if now:
                selection.namespaces.add(name)
            else:
                selection.namespaces.discard(name)
            for group in selection.groups:
                state = self._groups[group]
                if now:
                    joining = {
                        pod.key
                        for pod in self._store.pods_in(name)
                        if selector_matches(group.pod_selector, pod.labels)
                    }
                    state.members |= joining
                else:
                    joining = {key for key in state.members if key[0] == name}
                    state.members -= joining
                if joining:
                    state.ordered = None
                    state.derived.clear()
                    changed.add(group)
        return changed
