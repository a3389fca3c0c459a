"""Which shard holds an item, and how many shards a set needs.

Placement is stable: an item's shard is a hash of its key modulo the shard count,
so as long as the count stays, an item joining, changing or leaving touches the
one shard that holds it and no other. Counts are powers of two and change only
when a shard would exceed its capacity (double) or the set has shrunk to a
quarter of what its shards hold (halve): a set that hovers around a boundary
does not flap, and a count change, which rewrites every shard, stays rare.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

MAX_SHARDS = 1 << 16  # far beyond any real set; a guard against a runaway loop


def placement_hash(key: str) -> int:
    """A stable 64-bit hash of an item key (Python's own hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def fits(hashes: Iterable[int], count: int, capacity: int) -> bool:
    """Whether no shard of ``count`` would hold more than ``capacity`` of the items."""
    loads = Counter(h % count for h in hashes)
    return not loads or max(loads.values()) <= capacity


def shard_count(hashes: list[int], capacity: int, current: int = 0) -> int:
    """The shard count for items with these placement hashes: ``current`` when every
    shard still fits and the set has not shrunk below a quarter of its shards'
    capacity; else the smallest power of two whose shards all fit."""
    if capacity < 1:
        raise ValueError(f"shard capacity {capacity} must be at least 1")
    total = len(hashes)
    if (
        current >= 1
        and (current == 1 or total * 4 > current * capacity)
        and fits(hashes, current, capacity)
    ):
        return current
    count = 1
    while not fits(hashes, count, capacity) and count < MAX_SHARDS:
        count *= 2
    return count
