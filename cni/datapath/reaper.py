"""The reaper: deletes what no packet can reach any more, and keeps the pool of
empty conntrack tables stocked, off the CNI path.

DEL deletes an endpoint's entry and addresses (plain hash maps, no wait):
from then on no program reaches its policy maps or its table. What is left
is garbage in the maps of maps, whose every delete costs an RCU grace
period: conntrack tables given back (dirty), policy ids no endpoint
references, and leftovers of writers that died midway. A pass:

1. under the state lock, a snapshot: the slots and policy ids the endpoint
   entries name, the free and dirty tables, the policy index. Unreferenced
   policy ids leave the index there and then, so no installer picks them up
   again; release counts are reset;
2. one grace period (``rcu.wait_for_readers``): a packet that read an
   endpoint entry before the snapshot, and may still use its slot or policy
   ids, has finished;
3. dirty tables are replaced by empty ones up to the pool's target (and, for
   the agent, new slots are added for what is still missing), in one batch:
   one grace period; then, under the state lock, they are free;
4. the other dirty tables and the unreferenced policy ids are deleted, from
   several threads at once so that their grace periods overlap.

Nothing is ever deleted that an endpoint entry names, nor a free table: the
snapshot is taken under the state lock, and tables are handed out and ids
installed under it too. Reapers run one at a time (a flock on
``<bpfDir>/reaper``, held for the pass, not the state lock), so two never
refill the same slot; a reaper that dies midway leaves its work to the next.

Who reaps: the agent runs a ``Reaper`` thread on its datapath handle (after
every release, and a full pass now and then); while it runs, the handle
names it (``datapath.reaper``), and writers kick it. A process without one
(the plugin in-process, sluicectl, tests) reaps when the ledger's release
counts pass a threshold, and GC does a full pass. So garbage never fills a map: the outer maps are
sized with room for it (bpf/maps.h).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from cni.datapath import ctpool, rcu
from cni.datapath.maps import Datapath
from cni.datapath.structs import NONE
from cni.spec.log import logger
from cni.work.queue import Worker, WorkQueue

log = logger("sluice")

REAPER_DIR = "reaper"
POOL_TARGET = 16  # empty tables kept ready (each costs its LRU's memory, ~0.4 MB at 4096)
TABLES_THRESHOLD = 32  # without a reaper thread, reap once this many tables were given back
POLICIES_THRESHOLD = 64  # ... or this many policy references were dropped
POLL_SECONDS = 1.0  # the thread looks at the ledger this often when nobody kicks it
PASS = "reap"  # the work queue's one key
FULL_SECONDS = 60.0  # and looks for leftovers this often
DELETERS = 16  # threads deleting at once (their grace periods overlap)


class Reaped:
    """What one pass did."""

    __slots__ = ("added", "policies_deleted", "refilled", "tables_deleted")

    def __init__(
        self, refilled: int = 0, added: int = 0, tables_deleted: int = 0, policies_deleted: int = 0
    ) -> None:
        self.refilled = refilled  # dirty tables replaced by empty ones, now free
        self.added = added  # new slots with empty tables, now free
        self.tables_deleted = tables_deleted
        self.policies_deleted = policies_deleted

    def _counts(self) -> tuple[int, int, int, int]:
        return (self.refilled, self.added, self.tables_deleted, self.policies_deleted)

    def __eq__(self, other: object) -> bool:
        return self._counts() == other._counts() if isinstance(other, Reaped) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # counts change as a pass goes

    def __repr__(self) -> str:
        return "Reaped(refilled={}, added={}, tables_deleted={}, policies_deleted={})".format(
            *self._counts()
        )

    def __bool__(self) -> bool:
        return any((self.refilled, self.added, self.tables_deleted, self.policies_deleted))


@contextlib.contextmanager
def reaper_lock(bpf_dir: str, block: bool = True) -> Iterator[bool]:
    """Exclusive among reapers of every process; yields False when ``block`` is False
    and another reaper is at work."""
    path = os.path.join(bpf_dir, REAPER_DIR)
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def reap(
    datapath: Datapath,
    pool: int = POOL_TARGET,
    stock: bool = False,
    full: bool = False,
    block: bool = True,
) -> Reaped | None:
    """One pass (see the module doc); None if ``block`` is False and another reaper is
    at work. ``pool``: free tables to keep, refilled from dirty ones; ``stock``: add new
    slots when dirty ones do not suffice; ``full``: also look for leftovers (every slot
    of ct_tables, every id of peers and rules), not only what was given back."""
    datapath.fd("ct_tables")  # DatapathMissing before any lock directory is made
    with reaper_lock(datapath.bpf_dir, block) as mine:
        if not mine:
            return None
        return _pass(datapath, pool, stock, full)


def _pass(datapath: Datapath, pool: int, stock: bool, full: bool) -> Reaped:
    entries = datapath.conntrack.capacity()
    with datapath.lock:
        endpoints = datapath.endpoints.all().values()
        used_slots = {ep.ct_slot for ep in endpoints}
        used_ids = {ep.egress_policy for ep in endpoints} | {ep.ingress_policy for ep in endpoints}
        free = ctpool.free_tables(datapath)
        dirty = ctpool.dirty_tables(datapath)
        if full:
            dirty |= datapath.conntrack.slots() - used_slots - set(free)
        resized = [slot for slot, size in free.items() if size != entries]
        for slot in resized:
            del free[slot]
        dirty = (dirty | set(resized)) - used_slots - {NONE}
        ctpool.unmark(datapath, resized)  # dirty from now on, for a pass that dies midway
        for slot in resized:
            datapath.conntrack.give_back(slot)
        index = datapath.policies.index()
        ids = set(index.values())
        if full:
            existing = datapath.policies.ids()
            ids |= existing
            stale = {digest for digest, pid in index.items() if pid not in existing}
        else:
            stale = set()
        doomed = ids - used_ids - {NONE}
        for digest, policy_id in index.items():
            if policy_id in doomed or digest in stale:
                datapath.policies.forget(digest)
        datapath.reset_releases()
        wanted = max(0, pool - len(free))
        refill = sorted(dirty)[:wanted]
        delete = sorted(dirty)[wanted:]
        added = datapath.conntrack.allocate_slots(wanted - len(refill)) if stock else []

    reaped = Reaped()
    if dirty or doomed:
        _grace(datapath)
    if refill or added:
        datapath.conntrack.insert_tables(refill + added, entries)
        with datapath.lock:
            ctpool.mark_free(datapath, refill + added, entries)
        reaped.refilled, reaped.added = len(refill), len(added)
    if delete or doomed:
        deletions: list[Callable[[], object]] = [
            functools.partial(datapath.conntrack.delete_table, slot) for slot in delete
        ]
        deletions += [functools.partial(datapath.policies.delete, pid) for pid in doomed]
        _in_parallel(deletions)
        with datapath.lock:
            ctpool.unmark(datapath, delete)
        reaped.tables_deleted, reaped.policies_deleted = len(delete), len(doomed)
    return reaped


def _grace(datapath: Datapath) -> None:
    """Wait until no program still runs that started before the call."""
    if rcu.wait_for_readers():
        return
    # No membarrier here: a write of a map of maps waits for a grace period too.
    # Slot 0 means "no table", so no endpoint ever reaches this one.
    datapath.conntrack.insert_tables([NONE], 1)
    datapath.conntrack.delete_table(NONE)


def _in_parallel(calls: Sequence[Callable[[], object]]) -> None:
    if len(calls) == 1:
        calls[0]()
        return
    from concurrent.futures import ThreadPoolExecutor  # only reapers need it

    name = f"{threading.current_thread().name}-deleter"  # its waits count as its caller's
    with ThreadPoolExecutor(min(DELETERS, len(calls)), thread_name_prefix=name) as workers:
        for done in [workers.submit(call) for call in calls]:
            done.result()


# -- who reaps ------------------------------------------------------------------------------


def after_release(datapath: Datapath) -> None:
    """Something was given back: wake the handle's reaper thread, or, without one,
    reap now if the ledger says enough has piled up (and no other reaper is at work)."""
    thread = datapath.reaper
    if thread is not None:
        thread.kick()
        return
    ledger = datapath.ledger()
    if ledger.released_tables >= TABLES_THRESHOLD or ledger.released_policies >= POLICIES_THRESHOLD:
        reap(datapath, block=False)


def table_taken(datapath: Datapath) -> None:
    """A free table was handed out: let the handle's reaper thread refill the pool."""
    thread = datapath.reaper
    if thread is not None:
        thread.kick()


def collect(datapath: Datapath) -> Reaped | None:
    """GC's part: a full pass, by the handle's reaper thread if it has one."""
    thread = datapath.reaper
    if thread is not None:
        thread.kick(full=True)
        return None
    return reap(datapath, full=True)


class Reaper:
    """A thread that reaps after every release on ``datapath`` and keeps ``pool``
    empty tables ready (the agent runs one for its lifetime)."""

    def __init__(self, datapath: Datapath, pool: int = POOL_TARGET) -> None:
        self.datapath = datapath
        self.pool = pool
        self._full = True  # the first pass looks for everything
        self._last_full = 0.0
        self._queue: WorkQueue[str] = WorkQueue(base=1.0)
        self._worker = Worker("reaper", self._queue, self._pass, log)

    def start(self) -> None:
        if self.datapath.reaper is not None:
            raise RuntimeError(f'the datapath in "{self.datapath.bpf_dir}" has a reaper already')
        self.datapath.reaper = self
        self._queue.add(PASS)
        self._worker.start()

    def stop(self) -> None:
        if self.datapath.reaper is self:
            self.datapath.reaper = None
        self._worker.stop()

    def kick(self, full: bool = False) -> None:
        self._full = self._full or full
        self._queue.add(PASS)

    def _pass(self, _key: str) -> float:
        """One look at the ledger (every pass looks for leftovers now and then); an
        exception leaves the rest to the next pass, after a backoff."""
        datapath = self.datapath
        full = self._full or time.monotonic() - self._last_full > FULL_SECONDS
        if full or self._due(datapath):
            self._full = False
            reaped = reap(datapath, self.pool, stock=True, full=full)
            if full:
                self._last_full = time.monotonic()
            if reaped:
                log.debug("reaper: %s", reaped)
        return POLL_SECONDS

    def _due(self, datapath: Datapath) -> bool:
        ledger = datapath.ledger()
        if ledger.released_tables or ledger.released_policies:
            return True
        return len(ctpool.free_tables(datapath)) < self.pool
