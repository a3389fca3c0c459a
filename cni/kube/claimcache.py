"""The cache of one pool's prefix claims (``ClaimCache``): what the claim store reads
instead of asking the API server, kept by an informer on every PrefixClaim (its sink)
and by the store's own writes.

Only claims of one block of the pool count (``ipam.claims.PoolBlocks``): a claim that
states this pool or overlaps it but is no block of it (a wider prefix, the node
network, another length, another pool) is refused, reported (log and ``refused``),
never adopted and never counted as taken, so that nobody who can write such an object
empties the pool or hands this node a range; its name alone stays taken. A claim of
another pool that leaves this one alone is none of the cache's business.

- The informer's list, at start and after a 410, replaces the cache. It must be a
  consistent read (from etcd, not the watch cache), so that a restarted agent sees
  every claim it made before.
- The store's own writes go into the cache at once (``put``: the ADD that claimed a
  block allocates from it before the watch tells), and the watch never takes the
  cache back: an event of a deleted object (by uid) or of an older spec (by
  ``metadata.generation``, which only spec changes bump) is ignored.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from cni.kube import prefixclaims
from ipam.claims import Block, Claim, PoolBlocks
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable
from ipam.space import unclaimed_space

log = logging.getLogger("sluice.claims")

DEAD_UIDS = 4096  # deleted objects remembered, so that a late event cannot revive one


class Entry(NamedTuple):
    """A claim as the cache holds it, with what a conditional write of it needs."""

    uid: str
    generation: int
    resource_version: str
    claim: Claim


def entry_of(obj: dict[str, Any]) -> Entry:
    """The entry of a PrefixClaim object; ClaimFormatError or ValueError if unreadable."""
    metadata = obj.get("metadata") or {}
    return Entry(
        str(metadata.get("uid", "")),
        int(metadata.get("generation") or 0),
        str(metadata.get("resourceVersion", "")),
        prefixclaims.parse(obj),
    )


class ClaimCache:
    def __init__(self, config: PrefixConfig) -> None:
        self.config = config
        self.pool = config.pool
        self.blocks = PoolBlocks(config.pool, config.prefix_length)
        self.synced = threading.Event()  # set once the first list is in
        # Called (from the informer's thread) when a claim this node holds is deleted
        # by somebody else: the Node's deletion, an operator. The agent reconciles then.
        self.on_lost: Callable[[], None] | None = None
        self._cache: dict[str, Entry] = {}
        self._refused: dict[str, str] = {}  # name -> why, of claims that do not count
        self._dead: deque[str] = deque(maxlen=DEAD_UIDS)
        self._dead_set: set[str] = set()
        self._deleting: set[str] = set()  # uids this store is deleting (not lost: given back)
        self._lock = threading.Lock()

    # -- the informer's sink ----------------------------------------------------------------

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """A list: the claims it holds replace the cache (but no deleted uid)."""
        # A write of this store racing with the list may be missing from it: the cache
        # then lacks a claim of this node until the watch brings it, and the IPAM's
        # reconciliation claims it again meanwhile (a 409 that reads it back).
        cache = {}
        for obj in objects:
            entry = self._readable(obj)
            if entry is not None and entry.uid not in self._dead_set:
                cache[prefixclaims.name_of(entry.claim.block)] = entry
        names = {(obj.get("metadata") or {}).get("name") for obj in objects}
        with self._lock:
            self._cache = cache
            self._refused = {n: why for n, why in self._refused.items() if n in names}
        self.synced.set()
        log.info("listed %d prefix claims of pool %s", len(cache), self.pool)

    def change(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """A watch event."""
        if event in ("ADDED", "MODIFIED"):
            self.put(obj)
        elif event == "DELETED":
            name = str((obj.get("metadata") or {}).get("name", ""))
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            with self._lock:
                self._refused.pop(name, None)
            if self.forget(name, uid) and self.on_lost is not None:
                log.warning("the claim of %s was deleted by somebody else", name)
                self.on_lost()

    # -- writing --------------------------------------------------------------------------------

    def put(self, obj: dict[str, Any]) -> None:
        """An object as the API server answered a write, or as an event brings it."""
        entry = self._readable(obj)
        if entry is None:
            return
        name = prefixclaims.name_of(entry.claim.block)
        with self._lock:
            if entry.uid in self._dead_set:
                return
            current = self._cache.get(name)
            if (
                current is not None
                and current.uid == entry.uid
                and entry.generation < current.generation
            ):
                return  # an event older than what this store wrote
            self._cache[name] = entry

    def forget(self, name: str, uid: str | None) -> bool:
        """Drop a deleted object (``uid`` None: whatever the name holds) and never take
        it back; True if it was a claim this node held that this store is not deleting."""
        with self._lock:
            current = self._cache.get(name)
            if current is None or (uid is not None and current.uid != uid):
                lost = False
            else:
                del self._cache[name]
                uid = current.uid
                holder = (current.claim.node, current.claim.network)
                lost = (
                    current.claim.held
                    and holder == (self.config.node_name, self.config.network)
                    and current.uid not in self._deleting
                )
            if uid:
                if len(self._dead) == self._dead.maxlen:
                    self._dead_set.discard(self._dead[0])
                self._dead.append(uid)
                self._dead_set.add(uid)
            return lost

    def discard(self, name: str) -> None:
        """Drop what the name holds (read back as missing), without remembering a uid."""
        with self._lock:
            self._cache.pop(name, None)

    @contextmanager
    def deleting(self, uid: str) -> Iterator[None]:
        """While this store deletes the object, its DELETED event is no loss."""
        with self._lock:
            self._deleting.add(uid)
        try:
            yield
        finally:
            with self._lock:
                self._deleting.discard(uid)

    # -- reading ----------------------------------------------------------------------------------

    def require_synced(self) -> None:
        if not self.synced.is_set():
            raise ClaimsUnavailable(
                f"the agent has not listed the prefix claims of pool {self.pool} from the "
                "Kubernetes API yet (is the API server reachable?)"
            )

    def claims(self) -> list[Claim]:
        self.require_synced()
        with self._lock:
            return [entry.claim for entry in self._cache.values()]

    def entry(self, block: Block) -> Entry | None:
        with self._lock:
            return self._cache.get(prefixclaims.name_of(block))

    def released_by(self, node: str, network: str) -> list[Block]:
        """The blocks (node, network) gave back whose object is still there, lowest first."""
        with self._lock:
            mine = [
                e.claim.block
                for e in self._cache.values()
                if not e.claim.held and (e.claim.node, e.claim.network) == (node, network)
            ]
        return sorted(mine, key=lambda b: int(b.network_address))

    def expired(self, now: float) -> list[Entry]:
        """This node's released claims whose cooldown is over at ``now``."""
        mine = (self.config.node_name, self.config.network)
        with self._lock:
            return [
                e
                for e in self._cache.values()
                if (e.claim.node, e.claim.network) == mine
                and e.claim.released_at is not None
                and now - e.claim.released_at >= self.config.cooldown_seconds
            ]

    def free_blocks(self, limit: int) -> list[Block]:
        """The lowest ``limit`` blocks of the pool nobody claims, as far as the cache knows."""
        with self._lock:
            claimed = [e.claim.block for e in self._cache.values()]
            refused = set(self._refused)  # their names are taken all the same
        found: list[Block] = []
        for network in unclaimed_space(self.pool, self.config.prefix_length, claimed):
            for block in network.subnets(new_prefix=self.config.prefix_length):
                if prefixclaims.name_of(block) in refused:
                    continue
                found.append(block)
                if len(found) >= limit:
                    return found
        return found

    @property
    def refused(self) -> dict[str, str]:
        """The claims of this pool that do not count, by name: why."""
        with self._lock:
            return dict(self._refused)

    def _readable(self, obj: dict[str, Any]) -> Entry | None:
        """The object's entry, if it is a readable claim of one block of the pool. One
        of another pool that leaves this one alone is none of this cache's business;
        one that states this pool or overlaps it but is no block of it is refused."""
        try:
            entry = entry_of(obj)
        except (prefixclaims.ClaimFormatError, ValueError) as err:
            log.error("ignoring a PrefixClaim this agent cannot read: %s", err)
            return None
        claim = entry.claim
        name = prefixclaims.name_of(claim.block)
        if claim.pool != self.pool and not claim.block.overlaps(self.pool):
            return None
        why = self.blocks.misfit(claim.block, claim.pool)
        with self._lock:
            if why is None:
                self._refused.pop(name, None)
                return entry
            said = self._refused.get(name)
            self._refused[name] = why
        if said != why:
            log.error(
                "refusing PrefixClaim %s of node %s: %s (neither adopted nor taken from the pool)",
                name,
                claim.node,
                why,
            )
        return None
