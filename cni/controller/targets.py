"""What each node's PolicyTargets say: the pods on the node (not on the host network),
each with its uid and the policies selecting it; and, per policy, the nodes where it
selects pods (a PolicyEndpoints object, and the sets it reads, are labelled for
exactly those nodes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from cni.controller.changes import Changes
from cni.policy.model import PodKey, PolicyKey


@dataclass(frozen=True)
class Selection:
    """What the node's PolicyTargets say about a pod."""

    node: str
    uid: str
    policies: tuple[str, ...]  # names, in the pod's namespace


class NodeChange(NamedTuple):
    """A policy's first selected pod on a node (``step`` +1), or its last gone (-1)."""

    policy: PolicyKey
    node: str
    step: int


class Targets:
    """The pods' selections, by node and by policy; marks in ``changes`` the nodes whose
    PolicyTargets change and the policies whose nodes change."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self._selected: dict[PodKey, Selection] = {}
        self._node_pods: dict[str, set[PodKey]] = {}
        self._policy_pods: dict[PolicyKey, set[PodKey]] = {}
        self._policy_nodes: dict[PolicyKey, Counter[str]] = {}

    def selection(self, pod: PodKey) -> Selection:
        return self._selected[pod]

    def nodes(self) -> set[str]:
        """The nodes that run a pod listed in PolicyTargets."""
        return set(self._node_pods)

    def runs_pods(self, node: str) -> bool:
        return node in self._node_pods

    def pods_on(self, node: str) -> list[PodKey]:
        return sorted(self._node_pods.get(node, ()))

    def pods_of(self, policy: PolicyKey) -> set[PodKey]:
        """The pods the policy selects (a copy)."""
        return set(self._policy_pods.get(policy, ()))

    def nodes_of(self, policy: PolicyKey) -> list[str]:
        """The nodes where the policy selects a pod."""
        return sorted(self._policy_nodes.get(policy, ()))

    def select(self, pod: PodKey, new: Selection | None) -> list[NodeChange]:
        """Make ``new`` the pod's selection (None: it is listed nowhere); the policies'
        first or last pods on a node that this makes, in order."""
        old = self._selected.get(pod)
        if new == old:
            return []
        namespace = pod[0]
        moved: list[NodeChange] = []
        if old is not None:
            self.changes.node(old.node)
            pods = self._node_pods[old.node]
            pods.discard(pod)
            if not pods:
                del self._node_pods[old.node]
            for name in old.policies:
                moved += self._count_node((namespace, name), old.node, -1)
                targets = self._policy_pods[(namespace, name)]
                targets.discard(pod)
                if not targets:
                    del self._policy_pods[(namespace, name)]
            del self._selected[pod]
        if new is not None:
            self.changes.node(new.node)
            self._node_pods.setdefault(new.node, set()).add(pod)
            for name in new.policies:
                moved += self._count_node((namespace, name), new.node, +1)
                self._policy_pods.setdefault((namespace, name), set()).add(pod)
            self._selected[pod] = new
        return moved

    def _count_node(self, policy: PolicyKey, node: str, step: int) -> list[NodeChange]:
        counts = self._policy_nodes.setdefault(policy, Counter())
        before = counts[node]
        counts[node] = before + step
        if counts[node] <= 0:
            del counts[node]
        if not counts:
            del self._policy_nodes[policy]
        if (before == 0) == (counts.get(node, 0) == 0):
            return []
        # The policy gained its first or lost its last selected pod on the node.
        self.changes.policy(policy)
        return [NodeChange(policy, node, step)]
