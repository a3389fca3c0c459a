"""Deleting cut-off veths after their DEL has answered.

The kernel's deletion of a veth waits for RCU callbacks (20 to 45 ms); DEL
has already taken the pair out of service (``cni.wiring.cut_off``), so the
agent finishes it here. A few deletions run at once, so that their waits
overlap in a burst of DELs. An ADD for the same attachment waits for its
pending deletion first (the new veth has the same name); stopping the agent
waits for all of them. Were the agent killed in between, the down veth is
found by its name or alias by the attachment's next ADD, or by GC.
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
        self._guard = threading.Lock()

    def defer(self, key: Key) -> Callable[[Callable[[], None]], None]:
        """The ``defer`` argument of DEL for this attachment."""

        def submit(finish: Callable[[], None]) -> None:
            future = self._pool.submit(self._run, key, finish)
            with self._guard:
                self._pending[key] = future
            future.add_done_callback(lambda done: self._forget(key, done))

        return submit

    def wait(self, key: Key) -> None:
        """Return once this attachment's pending deletion (if any) is done."""
        with self._guard:
            future = self._pending.get(key)
        if future is not None:
            future.result()

    def close(self) -> None:
        """Finish every pending deletion."""
        self._pool.shutdown(wait=True)

    @staticmethod
    def _run(key: Key, finish: Callable[[], None]) -> None:
        try:
            finish()
        except Exception:  # the veth stays down and unrouted; GC removes it
            log.exception("failed to delete the veth of %s/%s", *key)

    def _forget(self, key: Key, done: Future[None]) -> None:
        with self._guard:
            if self._pending.get(key) is done:
                del self._pending[key]
