"""An API server stand-in for the controller's objects: applies a ``Plan`` as the real one
would (resource versions, merge-patched labels), and shows a node what its label
selectors would show it."""

from __future__ import annotations

import copy
import itertools
from typing import Any, Protocol

from cni.controller.planner import Plan
from cni.controller.publisher import Publisher
from cni.policy.published.identity import ShardInfo, shard_info
from cni.policy.published.index import ShardIndex
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    TARGETS_NODE_LABEL,
    node_label,
    node_label_key,
)
from cni.policy.published.shards import (
    AddressShard,
    PolicyShard,
    TargetsShard,
    parse_address_set,
    parse_policy_endpoints,
    parse_policy_targets,
)

Key = tuple[str, str]  # (kind, name)


class Observer(Protocol):
    """What learns of the API's objects: a ``Publisher``, or a ``Ledger`` alone."""

    def observe(self, info: ShardInfo) -> object: ...

    def forget(self, info: ShardInfo) -> object: ...


class PublishedStore:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, Key]] = []  # (verb, object) of every write, in order
        self._versions = itertools.count(1)

    def apply(self, plan: Plan, publisher: Observer) -> None:
        """Carry out the plan and tell the publisher what the API now holds."""
        for write in plan.writes:
            key = write.key
            if write.verb == "relabel":
                stored = self.objects[key]
                labels = stored["metadata"]["labels"]
                for name, value in write.labels_patch.items():
                    if value is None:
                        labels.pop(name, None)
                    else:
                        labels[name] = value
            else:
                assert (write.verb == "create") == (key not in self.objects), write
                stored = copy.deepcopy(write.body)
                self.objects[key] = stored
            stored["metadata"]["resourceVersion"] = str(next(self._versions))
            self.writes.append((write.verb, key))
            publisher.observe(shard_info(stored))
        for info in plan.deletions:
            self.objects.pop(info.object_key, None)
            self.writes.append(("delete", info.object_key))
            publisher.forget(info)

    def for_node(self, node: str) -> tuple[list[Any], list[Any], list[Any]]:
        """(PolicyEndpoints, AddressSets, PolicyTargets) a node's agent watches, parsed."""
        label = node_label_key(node)
        policies, sets, targets = [], [], []
        for (kind, _), body in sorted(self.objects.items()):
            labels = body["metadata"].get("labels", {})
            if kind == POLICY_ENDPOINTS and label in labels:
                policies.append(parse_policy_endpoints(body))
            elif kind == ADDRESS_SET and label in labels:
                sets.append(parse_address_set(body))
            elif kind == POLICY_TARGETS and labels.get(TARGETS_NODE_LABEL) == node_label(node):
                targets.append(parse_policy_targets(body))
        return policies, sets, targets

    def feed(self, index: ShardIndex) -> None:
        """Give an agent's index what its watches would hold now (a relist)."""
        policies, sets, targets = self.for_node(index.node_name)
        index.replace_all(AddressShard, sets)
        index.replace_all(PolicyShard, policies)
        index.replace_all(TargetsShard, targets)


def publish(publisher: Publisher, store: PublishedStore, rounds: int = 3) -> None:
    """Plan and apply until nothing is left to do (echoes may ask for a check)."""
    for _ in range(rounds):
        plan = publisher.plan()
        if not plan:
            return
        store.apply(plan, publisher)
    assert not publisher.plan(), "the publisher still has something to write"
