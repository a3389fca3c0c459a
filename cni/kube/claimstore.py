"""Prefix claims in the Kubernetes API: ``ipam.claims.ClaimStore`` over PrefixClaim
objects (``cni.kube.prefixclaims``), for one network of one node.

The API server is the only arbiter: a block is claimed by creating the object
named after it, and a create that finds the name taken (409) lost the block to
another node. Nothing else needs to be exact, so the store reads from a cache
kept by a list and a watch of every PrefixClaim. Only claims of one block of the
pool count (``ipam.claims.PoolBlocks``): a claim that states this pool or overlaps
it but is no block of it (a wider prefix, the node network, another length, another
pool) is refused, reported (log and ``refused``), never adopted and never counted as
taken, so that nobody who can write such an object empties the pool or hands this
node a range; its name alone stays taken:

- the list at start and after a 410 is a consistent read (from etcd, not the
  watch cache), so a restarted agent sees every claim it made before;
- the store's own writes go into the cache at once (the ADD that claimed a block
  allocates from it before the watch tells), and the watch never takes the cache
  back: an event of a deleted object (by uid) or of an older spec (by
  ``metadata.generation``, which only spec changes bump) is ignored;
- a stale cache costs at most a create that fails with 409, after which the
  winner's object is read and cached.

Candidates: the node first takes back a block it gave back whose cooldown is not
over; else the lowest free block; after a conflict, a block at random among the
lowest ``SPREAD`` free ones, so that nodes racing for blocks spread out instead of
colliding again. ``MAX_CONFLICTS`` conflicts in a row end the claim with an error.

Giving a block back sets ``spec.releasedAt``; the object is deleted once the
network's ``cooldownSeconds`` have passed since (with the uid and resourceVersion
as preconditions, so a block taken back meanwhile stays). Usage (``status``) and
Events go out from a background thread, never on a CNI call's path.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, NamedTuple

from cni.kube import prefixclaims
from cni.kube.api import Api, ApiError, Gone
from cni.kube.events import NodeEvents
from cni.work.backoff import HEALTHY_WATCH_SECONDS, Backoff
from cni.work.queue import Worker, WorkQueue
from ipam.claims import Block, BlockUsage, Claim, PoolBlocks, Shortage
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable, StoreError
from ipam.space import unclaimed_space

log = logging.getLogger("sluice.claims")

SPREAD = 32
MAX_CONFLICTS = 20
FLUSH_SECONDS = 0.5  # usage is published at most this often
SWEEP_SECONDS = 1.0  # released claims are looked at this often
ROUND = "round"  # the work queue's one key
DEAD_UIDS = 4096  # deleted objects remembered, so that a late event cannot revive one
REASONS = {"fragmented": "PrefixPoolFragmented", "exhausted": "PrefixPoolExhausted"}


class Entry(NamedTuple):
    uid: str
    generation: int
    resource_version: str
    claim: Claim


def _entry(obj: dict[str, Any]) -> Entry:
    metadata = obj.get("metadata") or {}
    return Entry(
        str(metadata.get("uid", "")),
        int(metadata.get("generation") or 0),
        str(metadata.get("resourceVersion", "")),
        prefixclaims.parse(obj),
    )


def _unreachable(err: ApiError) -> bool:
    return err.status == 0 or err.status == 429 or err.status >= 500


class ApiClaimStore:
    def __init__(
        self,
        api: Api,
        config: PrefixConfig,
        events: NodeEvents | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.config = config
        self.pool = config.pool
        self.blocks = PoolBlocks(config.pool, config.prefix_length)
        self.node = config.node_name
        self.network = config.network
        self.events = events
        self.now = now
        # Called (from the watch thread) when a claim this node holds is deleted by
        # somebody else: the Node's deletion, an operator. The agent reconciles then.
        self.on_lost: Callable[[], None] | None = None
        self.synced = threading.Event()
        self.conflicts = 0  # creates that lost to another node
        self.shortages: Counter[str] = Counter()  # ADDs that found no block, by reason
        self._cache: dict[str, Entry] = {}
        self._refused: dict[str, str] = {}  # name -> why, of claims that do not count
        self._dead: deque[str] = deque(maxlen=DEAD_UIDS)
        self._dead_set: set[str] = set()
        self._deleting: set[str] = set()  # uids this store is deleting (not lost: given back)
        self._lock = threading.Lock()
        self._pending: dict[Block, BlockUsage] = {}
        self._published: dict[Block, BlockUsage] = {}
        self._shortage: Shortage | None = None
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, name="claims-watch", daemon=True)
        # Usage, shortages and released claims go out in rounds, at most one per
        # FLUSH_SECONDS: what changes meanwhile goes out together.
        self._work: WorkQueue[str] = WorkQueue()
        self._worker = Worker(
            "claims-work", self._work, self._round, log,
            expected=(ApiError, ClaimsUnavailable, StoreError), spacing=FLUSH_SECONDS,
        )  # fmt: skip
        self._next_sweep = 0.0

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._watcher.start()
        self._work.add(ROUND)  # then one every FLUSH_SECONDS or so: sweeps are periodic
        self._worker.start()

    def stop(self) -> None:
        """Publish what is pending, then stop (close the Api afterwards: that ends the
        watch's open request)."""
        self._stopping.set()
        self._worker.stop(timeout=10)
        try:
            self._flush_usage()
        except ApiError as err:
            log.warning("prefix claims: usage not published at stop: %s", err)

    def close(self) -> None:
        """Allocators share the store: their close leaves it open (``stop`` ends it)."""

    # -- the ClaimStore interface (called under the node store's write lock) -------------

    def claims(self) -> list[Claim]:
        self._require_synced()
        with self._lock:
            return [entry.claim for entry in self._cache.values()]

    def claim(self, node: str, network: str) -> Block | None:
        self._require_synced()
        node_uid = self._node_uid()
        conflicts = 0
        while True:
            for block in self._released_by(node, network):
                if self._take_back(block):
                    return block
            candidates = self._free_blocks(SPREAD)
            if not candidates:
                return None
            block = candidates[0] if conflicts == 0 else random.choice(candidates)
            if self._create(block, node, node_uid, network):
                return block
            conflicts += 1
            with self._lock:
                self.conflicts += 1
            if conflicts >= MAX_CONFLICTS:
                raise StoreError(
                    f"no block of pool {self.pool} claimed after {conflicts} conflicts in a "
                    "row: other nodes won each one"
                )

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        self._require_synced()
        why = self.blocks.misfit(block, self.pool)
        if why is not None:
            raise StoreError(f"not claiming {block}: {why}")
        entry = self._entry(block)
        if entry is None:
            if self._create(block, node, self._node_uid(), network):
                return True
            entry = self._entry(block)
        if entry is None or (entry.claim.node, entry.claim.network) != (node, network):
            return False
        return entry.claim.held or self._take_back(block)

    def release(self, block: Block, node: str) -> None:
        entry = self._entry(block)
        if entry is None or entry.claim.node != node or not entry.claim.held:
            return
        if self.config.cooldown_seconds <= 0:
            self._delete(entry)
            return
        patch = {"spec": {"releasedAt": prefixclaims.rfc3339(self.now())}}
        self._write(lambda: self.api.patch(prefixclaims.path_of(block), patch), block)
        log.info("released block %s (deleted after %.0f s)", block, self.config.cooldown_seconds)

    def report_usage(self, node: str, used: dict[Block, BlockUsage]) -> None:
        with self._lock:
            for block, usage in used.items():
                if self._published.get(block) != usage:
                    self._pending[block] = usage
        if self._pending:
            self._work.add(ROUND)

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        with self._lock:
            self.shortages[shortage.reason] += 1
            self._shortage = shortage
        log.warning("no block to claim for node %s: %s", node, shortage.message)
        self._work.add(ROUND)

    @property
    def refused(self) -> dict[str, str]:
        """The claims of this pool that do not count, by name: why."""
        with self._lock:
            return dict(self._refused)

    # -- reading the cache -------------------------------------------------------------------

    def _require_synced(self) -> None:
        if not self.synced.is_set():
            raise ClaimsUnavailable(
                f"the agent has not listed the prefix claims of pool {self.pool} from the "
                "Kubernetes API yet (is the API server reachable?)"
            )

    def _entry(self, block: Block) -> Entry | None:
        with self._lock:
            return self._cache.get(prefixclaims.name_of(block))

    def _released_by(self, node: str, network: str) -> list[Block]:
        with self._lock:
            mine = [
                e.claim.block
                for e in self._cache.values()
                if not e.claim.held and (e.claim.node, e.claim.network) == (node, network)
            ]
        return sorted(mine, key=lambda b: int(b.network_address))

    def _free_blocks(self, limit: int) -> list[Block]:
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

    # -- writing -------------------------------------------------------------------------------

    def _node_uid(self) -> str:
        """The uid of this node's Node: claims are owned by it."""
        try:
            node = self.api.get(f"/api/v1/nodes/{self.node}")
        except ApiError as err:
            raise self._error(f"reading Node {self.node}", err) from None
        if node is None:
            raise ClaimsUnavailable(
                f"Node {self.node} is not registered in the Kubernetes API: prefix claims "
                "are owned by their Node"
            )
        return str(node["metadata"]["uid"])

    def _create(self, block: Block, node: str, node_uid: str, network: str) -> bool:
        """Create the block's claim: True if it is this call's, False if somebody's (the
        winner's object is cached then)."""
        obj = prefixclaims.claim_object(block, self.pool, node, node_uid, network)
        try:
            created = self.api.create(prefixclaims.PATH, obj)
        except ApiError as err:
            if err.status != 409:
                raise self._error(f"claiming {block}", err) from None
            self._refresh(block)
            return False
        self._put(created)
        log.info("claimed block %s of pool %s", block, self.pool)
        return True

    def _take_back(self, block: Block) -> bool:
        """Take back a block this node gave back (its cooldown not over yet)."""
        entry = self._entry(block)
        if entry is None or entry.claim.held:
            return entry is not None
        patch = {
            "metadata": {"resourceVersion": entry.resource_version},
            "spec": {"releasedAt": None},
        }
        try:
            self._put(self.api.patch(prefixclaims.path_of(block), patch))
        except ApiError as err:
            if err.status not in (404, 409):
                raise self._error(f"taking back {block}", err) from None
            self._refresh(block)  # deleted or changed meanwhile: look again
            return False
        given_back = self.now() - (entry.claim.released_at or self.now())
        log.info("took back block %s, given back %.0f s ago", block, given_back)
        return True

    def _write(self, request: Callable[[], dict[str, Any]], block: Block) -> None:
        try:
            self._put(request())
        except ApiError as err:
            if err.status == 404:
                self._forget(prefixclaims.name_of(block), None)
                return
            raise self._error(f"writing the claim of {block}", err) from None

    def _delete(self, entry: Entry) -> bool:
        """Delete a claim if it is still the version read; False if it changed."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": entry.uid, "resourceVersion": entry.resource_version},
        }
        path = prefixclaims.path_of(entry.claim.block)
        with self._lock:
            self._deleting.add(entry.uid)
        try:
            # Api.delete sends no body; the preconditions need one.
            self.api._json("DELETE", path, json=options)
        except ApiError as err:
            if err.status == 409:
                self._refresh(entry.claim.block)
                return False
            if err.status != 404:
                raise self._error(f"deleting the claim of {entry.claim.block}", err) from None
        finally:
            with self._lock:
                self._deleting.discard(entry.uid)
        self._forget(prefixclaims.name_of(entry.claim.block), entry.uid)
        return True

    def _refresh(self, block: Block) -> None:
        name = prefixclaims.name_of(block)
        try:
            obj = self.api.get(prefixclaims.path_of(block))
        except ApiError as err:
            raise self._error(f"reading the claim of {block}", err) from None
        if obj is None:
            with self._lock:
                self._cache.pop(name, None)
        else:
            self._put(obj)

    def _error(self, doing: str, err: ApiError) -> ClaimsUnavailable | StoreError:
        message = f"{doing} in the Kubernetes API failed: {err}"
        return ClaimsUnavailable(message) if _unreachable(err) else StoreError(message)

    # -- the cache -------------------------------------------------------------------------------

    def _readable(self, obj: dict[str, Any]) -> Entry | None:
        """The object's entry, if it is a readable claim of one block of the pool. One
        of another pool that leaves this one alone is none of this store's business;
        one that states this pool or overlaps it but is no block of it is refused."""
        try:
            entry = _entry(obj)
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

    def _put(self, obj: dict[str, Any]) -> None:
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

    def _forget(self, name: str, uid: str | None) -> bool:
        """Drop a deleted object (``uid`` None: whatever the name holds); True if it was
        a claim this node held."""
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
                    and holder == (self.node, self.network)
                    and current.uid not in self._deleting
                )
            if uid:
                if len(self._dead) == self._dead.maxlen:
                    self._dead_set.discard(self._dead[0])
                self._dead.append(uid)
                self._dead_set.add(uid)
            return lost

    def _list(self) -> str:
        # No resourceVersion: a consistent read, so nothing this node created before a
        # restart is missing from what it adopts.
        # A write of this store racing with the list may be missing from it: the cache
        # then lacks a claim of this node until the watch brings it, and the IPAM's
        # reconciliation claims it again meanwhile (a 409 that reads it back).
        listed = self.api.list(prefixclaims.PATH)
        cache = {}
        for obj in listed.items:
            entry = self._readable(obj)
            if entry is not None and entry.uid not in self._dead_set:
                cache[prefixclaims.name_of(entry.claim.block)] = entry
        names = {(obj.get("metadata") or {}).get("name") for obj in listed.items}
        with self._lock:
            self._cache = cache
            self._refused = {n: why for n, why in self._refused.items() if n in names}
        self.synced.set()
        log.info("listed %d prefix claims of pool %s", len(cache), self.pool)
        return listed.resource_version

    def _watch_loop(self) -> None:
        # As an informer's: every failure, 410 and watch that ends at once waits
        # (jittered, growing) before the next request, so that the agents of a
        # cluster do not list from etcd in step; a watch open 5 s resets the waits.
        backoff = Backoff()
        version = ""
        while not self._stopping.is_set():
            watching_since: float | None = None
            ended = False
            try:
                if not version:
                    version = self._list()
                watching_since = time.monotonic()
                for event, obj in self.api.watch(prefixclaims.PATH, version):
                    if self._stopping.is_set():
                        return
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    self._apply(event, obj)
                ended = True
                problem = "the watch ended at once"
            except Gone:
                version = ""
                problem = "resourceVersion gone, listing again"
            except Exception as err:
                if self._stopping.is_set():
                    return
                if isinstance(err, ApiError):
                    problem = str(err)
                else:
                    log.exception("prefix claims: unexpected failure; listing again")
                    problem = "unexpected failure"
                    version = ""
            if self._stopping.is_set():
                return
            if watching_since is not None and (
                time.monotonic() - watching_since >= HEALTHY_WATCH_SECONDS
            ):
                backoff.reset()
                if ended:
                    continue
            delay = backoff.next()
            log.warning("prefix claims: %s; retrying in %.1f s", problem, delay)
            self._stopping.wait(delay)

    def _apply(self, event: str, obj: dict[str, Any]) -> None:
        if event in ("ADDED", "MODIFIED"):
            self._put(obj)
        elif event == "DELETED":
            name = (obj.get("metadata") or {}).get("name", "")
            uid = (obj.get("metadata") or {}).get("uid", "")
            with self._lock:
                self._refused.pop(str(name), None)
            if self._forget(str(name), str(uid)) and self.on_lost is not None:
                log.warning("the claim of %s was deleted by somebody else", name)
                self.on_lost()

    # -- background work: usage, expired releases, events ----------------------------------------

    def _round(self, _key: str) -> float:
        self._flush_usage()
        self._report_shortage()
        if time.monotonic() >= self._next_sweep and self.synced.is_set():
            self.sweep()
            self._next_sweep = time.monotonic() + SWEEP_SECONDS
        return FLUSH_SECONDS

    def _flush_usage(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for block, usage in pending.items():
            path = prefixclaims.path_of(block) + "/status"
            try:
                self._put(self.api.patch(path, prefixclaims.usage_status(usage)))
            except ApiError as err:
                if err.status != 404:
                    with self._lock:
                        self._pending.setdefault(block, usage)
                    raise
                continue
            with self._lock:
                self._published[block] = usage

    def _report_shortage(self) -> None:
        with self._lock:
            shortage, self._shortage = self._shortage, None
        if shortage is None or self.events is None:
            return
        self.events.warning(REASONS[shortage.reason], shortage.message, self._node_uid())

    def sweep(self) -> int:
        """Delete this node's released claims whose cooldown is over; how many."""
        now = self.now()
        with self._lock:
            expired = [
                e
                for e in self._cache.values()
                if (e.claim.node, e.claim.network) == (self.node, self.network)
                and e.claim.released_at is not None
                and now - e.claim.released_at >= self.config.cooldown_seconds
            ]
        deleted = 0
        for entry in expired:
            if self._delete(entry):
                deleted += 1
                log.info("deleted the claim of %s: its cooldown is over", entry.claim.block)
        return deleted
