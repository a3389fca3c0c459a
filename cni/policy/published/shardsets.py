"""The completeness rule: which sets of shards an agent may use.

A set's shards belong together when they agree on its version (a policy's uid
and generation; nothing for address sets and targets) and on the shard count.
The set is complete when shards ``0..count-1`` are all held, agreeing. The
agent uses the newest complete version of each set and nothing else:

- a shard of a new version replaces its index's old shard at once, but the
  set's complete version stays the old one until every shard of the new one
  has arrived; a partial set is never used;
- a shard that goes missing (deleted, or no longer labelled for this node)
  changes nothing while any shard of the set remains: what was complete stays
  in use. Only a set with no shard left is forgotten.

Within one version and count, an item always lives in the same shard (stable
placement, ``sharding``), so a set whose shards were rewritten one at a time is
consistent at every step: each shard is that item's newest state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from cni.policy.published.identity import ShardInfo


class HasInfo(Protocol):
    @property
    def info(self) -> ShardInfo: ...


S = TypeVar("S", bound=HasInfo)
SetKey = tuple[str, str, str]  # (kind, namespace, set name)


class ShardSets(Generic[S]):
    def __init__(self) -> None:
        self._held: dict[SetKey, dict[int, S]] = {}
        self._complete: dict[SetKey, tuple[S, ...]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def complete(self, key: SetKey) -> tuple[S, ...] | None:
        """The newest complete version of the set (its shards in index order), or None."""
        return self._complete.get(key)

    def held(self, key: SetKey) -> dict[int, S]:
        """The shards held now, complete or not (for status and tests)."""
        return dict(self._held.get(key, {}))

    def versions(self) -> dict[str, str]:
        """Every shard held: object name -> resourceVersion."""
        return {
            shard.info.name: shard.info.resource_version
            for held in self._held.values()
            for shard in held.values()
        }

    def completes(self) -> dict[SetKey, tuple[S, ...]]:
        return dict(self._complete)

    def every_held(self) -> list[S]:
        """Every shard held, complete or not (what a relist would give again)."""
        return [shard for held in self._held.values() for shard in held.values()]

    def put(self, shard: S) -> bool:
        """Hold a new or changed shard; True when the set's complete version changed."""
        key = shard.info.set_key
        self._held.setdefault(key, {})[shard.info.index] = shard
        return self._settle(key)

    def remove(self, shard: S) -> bool:
        """Forget a shard (deleted, or no longer for this node); True when the set's
        complete version changed, which only its last shard going does (the set is
        forgotten)."""
        key = shard.info.set_key
        held = self._held.get(key)
        if held is None:
            return False
        current = held.get(shard.info.index)
        if current is not None and current.info.name == shard.info.name:
            del held[shard.info.index]
        if held:
            return self._settle(key)
        del self._held[key]
        return self._complete.pop(key, None) is not None

    def replace_all(self, shards: Iterable[S]) -> set[SetKey]:
        """Hold exactly these shards (after a relist); the sets whose complete version
        changed or that disappeared."""
        fresh: dict[SetKey, dict[int, S]] = {}
        for shard in shards:
            fresh.setdefault(shard.info.set_key, {})[shard.info.index] = shard
        changed = {key for key in self._held if key not in fresh and key in self._complete}
        for key in changed:
            del self._complete[key]
        self._held = fresh
        for key in fresh:
            if self._settle(key):
                changed.add(key)
        return changed

    def _settle(self, key: SetKey) -> bool:
        held = self._held[key]
        first = held.get(0)
        if first is None:
            return False
        version, count = first.info.version, first.info.count
        shards = []
        for index in range(count):
            shard = held.get(index)
            if shard is None or shard.info.version != version or shard.info.count != count:
                return False  # incomplete: the last complete version stays in use
            shards.append(shard)
        current = self._complete.get(key)
        if current is not None and len(current) == count and all(map(_same, current, shards)):
            return False
        self._complete[key] = tuple(shards)
        return True


def _same(a: object, b: object) -> bool:
    return a is b
