"""One primitive for background work: a keyed queue with rate-limited requeue (the
pattern of client-go's workqueue), and the worker thread that drains it.

A key names work to do ("routes", "reap", an endpoint), never the data: the
worker reads the current state when it takes the key. So:

- adding a key that is already waiting does nothing: the work is done once,
  with the latest state;
- adding a key that a worker is processing queues it again for after that
  (a change during a pass is never lost, and no key is processed by two
  workers at once);
- a key whose processing failed comes back after a jittered delay that grows
  with its failures in a row (``Backoff`` per key), until it succeeds;
- ``add_after`` brings a key back later: the periodic resync of a
  reconciler; of several pending ``add_after`` of one key the earliest holds.

``Worker`` is the loop each background task used to write by hand (a stop
flag, a wake event, a backoff): take a key, process it, forget its failures
or requeue it with backoff, and stop when the queue shuts down.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from cni.work.backoff import Backoff

K = TypeVar("K", bound=Hashable)


class Log(Protocol):
    """What a worker logs through: a ``logging.Logger``, or one loaded when first used."""

    def warning(self, msg: str, *args: Any) -> Any: ...
    def exception(self, msg: str, *args: Any) -> Any: ...


class WorkQueue(Generic[K]):
    def __init__(
        self,
        base: float = 0.5,
        cap: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base, self.cap = base, cap
        self._clock = clock
        self._changed = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # waiting in _queue, or to be queued after processing
        self._processing: set[K] = set()
        self._due: dict[K, float] = {}  # add_after: when each delayed key is due
        self._delayed: list[tuple[float, int, K]] = []  # heap of (due, order, key)
        self._order = itertools.count()
        self._backoffs: dict[K, Backoff] = {}
        self._shutting_down = False

    # -- adding ------------------------------------------------------------------------

    def add(self, key: K) -> None:
        with self._changed:
            self._add(key)

    def _add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:  # else ``done`` queues it
            self._queue.append(key)
            self._changed.notify()

    def add_after(self, key: K, delay: float) -> None:
        """``key`` in ``delay`` seconds (at once for a delay of 0 or less)."""
        with self._changed:
            if delay <= 0:
                self._add(key)
                return
            due = self._clock() + delay
            if self._shutting_down or self._due.get(key, due + 1) <= due:
                return
            self._due[key] = due
            heapq.heappush(self._delayed, (due, next(self._order), key))
            self._changed.notify()  # a getter may be waiting for a later key

    def add_rate_limited(self, key: K) -> float:
        """``key`` again after its next backoff delay (failures in a row grow it);
        returns the delay."""
        with self._changed:
            backoff = self._backoffs.setdefault(key, Backoff(self.base, self.cap))
            delay = backoff.next()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """``key`` succeeded: its next failure waits the least again."""
        with self._changed:
            self._backoffs.pop(key, None)

    def failures(self, key: K) -> int:
        with self._changed:
            backoff = self._backoffs.get(key)
            return backoff.failures if backoff else 0

    # -- taking ------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (call ``done`` with it after), or None once the queue
        shuts down or ``timeout`` seconds pass without one."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._changed:
            while True:
                if self._shutting_down:
                    return None
                self._release_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                now = self._clock()
                waits = [due - now for due, _, _ in self._delayed[:1]]
                if deadline is not None:
                    if now >= deadline:
                        return None
                    waits.append(deadline - now)
                self._changed.wait(min(waits) if waits else None)

    def _release_due(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            due, _, key = heapq.heappop(self._delayed)
            if self._due.get(key) == due:  # else a later add_after replaced it
                del self._due[key]
                self._add(key)

    def done(self, key: K) -> None:
        with self._changed:
            self._processing.discard(key)
            if key in self._dirty:  # added again while it was processed
                self._queue.append(key)
                self._changed.notify()

    # -- stopping ----------------------------------------------------------------------

    def shut_down(self) -> None:
        """Every ``get`` returns None from now on; nothing is added any more."""
        with self._changed:
            self._shutting_down = True
            self._changed.notify_all()

    def __len__(self) -> int:
        """Keys waiting now (not those delayed)."""
        with self._changed:
            return len(self._queue)


class Worker(Generic[K]):
    """A thread that processes the keys of ``queue`` with ``process``.

    ``process(key)`` returns when to process the key again (seconds; None: only when
    it is added), or raises: an exception of ``expected`` is logged as a warning, any
    other with its traceback (a bug), and the key comes back after its backoff.
    ``spacing``: seconds between two passes at least, so that what changes
    meanwhile goes out together."""

    def __init__(
        self,
        name: str,
        queue: WorkQueue[K],
        process: Callable[[K], float | None],
        log: Log,
        expected: tuple[type[Exception], ...] = (),
        spacing: float = 0.0,
    ) -> None:
        self.name = name
        self.queue = queue
        self.process = process
        self.log = log
        self.expected = expected
        self.spacing = spacing
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Shut the queue down and wait for the pass under way, if any."""
        self._stopping.set()
        self.queue.shut_down()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                again = self.process(key)
            except Exception as err:
                delay = self.queue.add_rate_limited(key)
                if isinstance(err, self.expected):
                    self.log.warning("%s: %s (again in %.1f s)", self.name, err, delay)
                else:
                    self.log.exception("%s: processing %r failed (again in %.1f s)",
                                       self.name, key, delay)  # fmt: skip
            else:
                self.queue.forget(key)
                if again is not None:
                    self.queue.add_after(key, again)
            finally:
                self.queue.done(key)
            if self.spacing and self._stopping.wait(self.spacing):
                return
