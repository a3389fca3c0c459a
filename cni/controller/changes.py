"""What to plan again: the policies, address sets and nodes whose published objects
may differ from what they should be now, since the last plan took them.

The desired state marks what its inputs changed; the planner marks what the API
changed behind its back or refused, and takes everything at the start of a plan.
"""

from __future__ import annotations

from collections.abc import Iterable

from cni.policy.model import PodKey, PolicyKey
from cni.policy.published.sets import AddressSetKey


class Changes:
    """Policies, sets and nodes to plan again, the sets no policy reads any more (to
    delete), and whether to sweep objects that belong to nothing."""

    def __init__(self) -> None:
        self.policies: set[PolicyKey] = set()
        # A set's changed pods (only their shards are written), or None: every shard.
        self.sets: dict[AddressSetKey, set[PodKey] | None] = {}
        self.nodes: set[str] = set()
        self.retired: dict[AddressSetKey, str] = {}  # set -> its id, to delete
        self.sweep = False

    def __bool__(self) -> bool:
        # Not ``retired``: the policy change that retires a set marks the policy too.
        return bool(self.policies or self.sets or self.nodes or self.sweep)

    def policy(self, key: PolicyKey) -> None:
        self.policies.add(key)

    def node(self, name: str) -> None:
        self.nodes.add(name)

    def whole_set(self, key: AddressSetKey) -> None:
        """Every shard of the set: its shard count or its labels may change."""
        self.sets[key] = None

    def set_pods(self, key: AddressSetKey, pods: Iterable[PodKey]) -> None:
        """The shards that hold these pods (nothing more when every shard is due)."""
        due = self.sets.get(key, set())
        if due is None:
            return
        due |= set(pods)
        self.sets[key] = due

    def retire_set(self, key: AddressSetKey, set_id: str) -> None:
        """No policy reads the set any more: its objects are deleted, not written."""
        self.sets.pop(key, None)
        self.retired[key] = set_id

    def revive_set(self, key: AddressSetKey) -> None:
        """A policy reads the set (again): every shard is written, none deleted."""
        self.retired.pop(key, None)
        self.sets[key] = None

    def take(self) -> Changes:
        """What is marked, leaving nothing marked."""
        taken = Changes()
        taken.policies, self.policies = self.policies, set()
        taken.sets, self.sets = self.sets, {}
        taken.nodes, self.nodes = self.nodes, set()
        taken.retired, self.retired = self.retired, {}
        taken.sweep, self.sweep = self.sweep, False
        return taken

    def counts(self) -> dict[str, int]:
        return {
            "policies": len(self.policies),
            "addressSets": len(self.sets),
            "nodes": len(self.nodes),
        }
