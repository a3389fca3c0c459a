"""What is published: the controller's own objects as the API has them now (a digest
of each, ``ShardInfo``), fed by its informers on those objects and by its writes.

Objects of its kinds that are no shard the controller writes (a name their spec
does not derive) are held apart, as foreign: agents ignore them, and the next
plan deletes them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from cni.policy.published.identity import ShardInfo

log = logging.getLogger("sluice.k8s")

ObjectKey = tuple[str, str]  # (kind, name): every kind is cluster-scoped
SetKey = tuple[str, str, str]  # (kind, namespace, set name)


class Ledger:
    """The published objects by name and by set (the shards of one policy, address set
    or node), and the foreign ones. ``observe``, ``forget`` and ``replace`` say which
    objects changed: their sets are to be planned again."""

    def __init__(self) -> None:
        self._published: dict[ObjectKey, ShardInfo] = {}
        self._by_set: dict[SetKey, dict[str, ShardInfo]] = {}
        self._foreign: dict[ObjectKey, ShardInfo] = {}

    def observe(self, info: ShardInfo) -> bool:
        """An object of ours as the API has it now (listed, watched, or just written);
        whether it is new or of a new version (someone else may have changed it)."""
        if info.foreign and info.name != info.derived_name:
            log.warning("deleting %s %s: %s", info.kind, info.name, info.foreign)
            self._remove(info)
            self._foreign[info.object_key] = info
            return False
        self._foreign.pop(info.object_key, None)
        old = self._published.get(info.object_key)
        self._published[info.object_key] = info
        self._by_set.setdefault(info.set_key, {})[info.name] = info
        return old is None or old.resource_version != info.resource_version

    def forget(self, info: ShardInfo) -> bool:
        """An object of ours is gone; whether it was held as published."""
        self._foreign.pop(info.object_key, None)
        return self._remove(info)

    def replace(self, kind: str, infos: Iterable[ShardInfo]) -> list[ShardInfo]:
        """Make the objects of ``kind`` exactly ``infos`` (a relist); those that
        changed, as ``forget`` and ``observe`` say, in the order they were found."""
        changed = []
        held = [*self._published.items(), *self._foreign.items()]
        for old in [info for key, info in held if key[0] == kind]:
            if self.forget(old):
                changed.append(old)
        for info in infos:
            if self.observe(info):
                changed.append(info)
        return changed

    def get(self, key: ObjectKey) -> ShardInfo | None:
        return self._published.get(key)

    def of_kind(self, kind: str) -> list[ShardInfo]:
        return [info for key, info in self._published.items() if key[0] == kind]

    def all(self) -> list[ShardInfo]:
        return list(self._published.values())

    def shards(self, kind: str, namespace: str, set_name: str) -> list[ShardInfo]:
        """The published shards of one set, by index."""
        return sorted(
            self._by_set.get((kind, namespace, set_name), {}).values(),
            key=lambda info: info.index,
        )

    def shard_count(self, kind: str, namespace: str, set_name: str) -> int:
        """The shard count the set's shard 0 records; 0 without one."""
        for info in self.shards(kind, namespace, set_name):
            if info.index == 0:
                return info.count
        return 0

    def foreign(self) -> list[ShardInfo]:
        return list(self._foreign.values())

    def count(self) -> int:
        return len(self._published)

    def count_by_kind(self) -> dict[str, int]:
        return dict(Counter(key[0] for key in self._published))

    def _remove(self, info: ShardInfo) -> bool:
        old = self._published.pop(info.object_key, None)
        if old is None:
            return False
        shards = self._by_set.get(old.set_key)
        if shards is not None:
            shards.pop(old.name, None)
            if not shards:
                del self._by_set[old.set_key]
        return True
