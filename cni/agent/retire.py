"""Finishing DELs after they have answered.

DEL answers once the pair is out of service (``cni.plugin.verbs.delete``: down,
unrouted, its endpoint forgotten); the rest runs here, in two stages:

1. the release (masquerade entry, conntrack entries, the address), at once,
   a few at a time so that their waits overlap in a burst of DELs;
2. then the veth's deletion, at a quiet moment: when no CNI call has been
   in flight for ``QUIET_SECONDS`` (or the oldest has waited
   ``LONGEST_SECONDS``), one veth at a time. Deleting a veth makes the
   kernel wait 20 to 50 ms for RCU callbacks, part of it holding the RTNL
   lock that every other netlink request waits for, and costs CPU; run
   beside the next calls, it made each DEL of a sequence wait for the ones
   before it (bench/results/add-del.md, "Many live pods"). A down,
   endpoint-less veth carries nothing meanwhile.

An ADD or a repeated DEL of the same attachment waits for both stages of its
pending DEL first (its deletion then runs at once: the new veth has the same
name), GC waits for all of them, and so does stopping the agent. Were the
agent killed in between, the down veth marks the unfinished DEL: the agent
finishes it at its next start (``Agent.start``), as would the attachment's
next ADD or GC. Should a release fail, its veth is left down for them too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("sluice.agent")

WORKERS = 4
QUIET_SECONDS = 0.1  # no CNI call for this long: veths are deleted
LONGEST_SECONDS = 2.0  # ... or once the oldest has waited this long, quiet or not
Key = tuple[str, str]  # (container id, ifname)
Step = Callable[[], None]


class Retirer:
    def __init__(
        self,
        workers: int = WORKERS,
        quiet: float = QUIET_SECONDS,
        longest: float = LONGEST_SECONDS,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="retire")
        self._quiet, self._longest = quiet, longest
        self._pending: dict[Key, Future[None]] = {}  # releases
        self._deletions: dict[Key, tuple[float, Step]] = {}  # veths waiting for a quiet moment
        self._deleting: set[Key] = set()
        self._finished = 0
        self._calls = 0
        self._last_call = float("-inf")
        self._closing = False
        self._guard = threading.Condition()
        self._deleter = threading.Thread(target=self._delete_when_quiet, name="retire-veths")
        self._deleter.daemon = True
        self._deleter.start()

    def defer(self, key: Key) -> Callable[[Step | None, Step], None]:
        """The ``defer`` argument of DEL for this attachment: (the release, or None when
        DEL made it; the veth's deletion)."""

        def submit(release: Step | None, delete_veth: Step) -> None:
            with self._guard:  # in _pending before its callback can look for it
                future = self._pool.submit(self._release, key, release, delete_veth)
                self._pending[key] = future
            future.add_done_callback(lambda done: self._forget(key, done))

        return submit

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around each CNI call: veths are deleted only when none is in flight."""
        with self._guard:
            self._calls += 1
        try:
            yield
        finally:
            with self._guard:
                self._calls -= 1
                self._last_call = time.monotonic()
                self._guard.notify_all()

    def wait(self, key: Key) -> None:
        """Return once this attachment's pending DEL (if any) is done, veth and all."""
        with self._guard:
            future = self._pending.get(key)
        if future is not None:
            future.result()
        with self._guard:
            job = self._deletions.pop(key, None)
            while key in self._deleting:
                self._guard.wait()
            if job is not None:
                self._deleting.add(key)
        if job is not None:
            self._delete(key, job[1])

    def progress(self) -> tuple[int, bool]:
        """(releases finished so far, whether any is pending): an ADD that failed for
        want of an address compares it with what it was before it tried."""
        with self._guard:
            return self._finished, bool(self._pending)

    def drain(self) -> None:
        """Return once every DEL submitted so far is done, its veth deleted."""
        with self._guard:
            pending = list(self._pending.values())
        for future in pending:
            future.exception()  # failures are logged by _release
        with self._guard:
            keys = list(self._deletions) + list(self._deleting)
        for key in keys:
            self.wait(key)

    def close(self) -> None:
        """Finish every pending DEL."""
        self._pool.shutdown(wait=True)
        with self._guard:
            self._closing = True
            self._guard.notify_all()
        self._deleter.join()

    def _release(self, key: Key, release: Step | None, delete_veth: Step) -> None:
        try:
            if release is not None:
                release()
        except Exception:  # the veth stays down: the next start, ADD or GC finishes it
            log.exception("failed to finish the DEL of %s/%s", *key)
            return
        with self._guard:
            self._deletions[key] = (time.monotonic(), delete_veth)
            self._guard.notify_all()

    def _forget(self, key: Key, done: Future[None]) -> None:
        with self._guard:
            self._finished += 1
            if self._pending.get(key) is done:
                del self._pending[key]

    def _due_in(self, now: float) -> float:
        """Seconds until the next deletion may run (0: now). Call with the guard held."""
        if self._closing:
            return 0.0
        oldest = min(since for since, _ in self._deletions.values())
        overdue = oldest + self._longest - now
        if self._calls:
            return max(0.0, overdue)
        return max(0.0, min(overdue, self._last_call + self._quiet - now))

    def _delete_when_quiet(self) -> None:
        while True:
            with self._guard:
                while True:
                    if self._deletions:
                        wait = self._due_in(time.monotonic())
                        if wait <= 0:
                            break
                        self._guard.wait(wait)
                    elif self._closing:
                        return
                    else:
                        self._guard.wait()
                key = next(iter(self._deletions))
                _, delete_veth = self._deletions.pop(key)
                self._deleting.add(key)
            self._delete(key, delete_veth)

    def _delete(self, key: Key, delete_veth: Step) -> None:
        try:
            delete_veth()
        except Exception:  # down and endpoint-less: the next start, ADD or GC deletes it
            log.exception("failed to delete the veth of %s/%s", *key)
        finally:
            with self._guard:
                self._deleting.discard(key)
                self._guard.notify_all()
