"""Finishing DELs after they have answered.

DEL answers once the pair is out of service (``cni.plugin.verbs.delete``: down,
unrouted, its endpoint forgotten); the rest (masquerade entry, conntrack
entries, the address, and last the veth, whose deletion waits 20 to 45 ms
for the kernel's RCU callbacks) runs here. A few run at once, so that their
waits overlap in a burst of DELs. An ADD or a repeated DEL of the same
attachment waits for its pending release first (the new veth has the same
name), GC waits for all of them, and so does stopping the agent. Were the
agent killed in between, the down veth marks the unfinished DEL: the agent
finishes it at its next start (``Agent.start``), as would the attachment's
next ADD or GC.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("sluice.agent")

WORKERS = 4
Key = tuple[str, str]  # (container id, ifname)


class Retirer:
    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="retire")
        self._pending: dict[Key, Future[None]] = {}
        self._finished = 0
        self._guard = threading.Lock()

    def defer(self, key: Key) -> Callable[[Callable[[], None]], None]:
        """The ``defer`` argument of DEL for this attachment."""

        def submit(finish: Callable[[], None]) -> None:
            with self._guard:  # in _pending before its callback can look for it
                future = self._pool.submit(self._run, key, finish)
                self._pending[key] = future
            future.add_done_callback(lambda done: self._forget(key, done))

        return submit

    def wait(self, key: Key) -> None:
        """Return once this attachment's pending release (if any) is done."""
        with self._guard:
            future = self._pending.get(key)
        if future is not None:
            future.result()

    def progress(self) -> tuple[int, bool]:
        """(releases finished so far, whether any is pending): an ADD that failed for
        want of an address compares it with what it was before it tried."""
        with self._guard:
            return self._finished, bool(self._pending)

    def drain(self) -> None:
        """Return once every release submitted so far is done."""
        with self._guard:
            pending = list(self._pending.values())
        for future in pending:
            future.exception()  # failures are logged by _run

    def close(self) -> None:
        """Finish every pending release."""
        self._pool.shutdown(wait=True)

    @staticmethod
    def _run(key: Key, finish: Callable[[], None]) -> None:
        try:
            finish()
        except Exception:  # the veth stays down: the next start, ADD or GC finishes it
            log.exception("failed to finish the DEL of %s/%s", *key)

    def _forget(self, key: Key, done: Future[None]) -> None:
        with self._guard:
            self._finished += 1
            if self._pending.get(key) is done:
                del self._pending[key]
