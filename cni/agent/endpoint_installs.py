"""What each local endpoint has installed, and the batches that install it: the
enforcer's side that writes (``cni.agent.enforcer`` decides what to install).

- every install is a whole generation switched in one map write (the
  writer's ``install_many``, ``cni.datapath.interfaces.PolicyWriter``: the
  only way the enforcer reaches the datapath); an endpoint's installs are
  serialised by its own lock and each computes the policy from the newest
  state, so a slow install can be overtaken, never reverted;
- every change marks the endpoints it may affect; a worker thread
  reinstalls those whose policy differs from what is installed, the whole
  batch in one ``install_many`` (rule sets shared by content: the agent's
  writer compiles each once, and new ones are inserted in one batch);
- only what the writer reports installed is recorded as installed; an
  endpoint it reports failed stays queued and is tried again, and so does
  its whole batch when it raises (an OSError may come after some writes);
- an endpoint whose resolver lacks inputs (``PolicyIncomplete``) keeps what
  is installed; the inputs' arrival marks it again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from cni.agent.state import EndpointRecord
from cni.datapath.interfaces import PolicyWriter
from cni.policy.errors import PolicyIncomplete
from cni.policy.vocabulary import EndpointPolicy, PolicyError
from cni.work.queue import Worker, WorkQueue

log = logging.getLogger("sluice.agent")

EndpointKey = tuple[str, str]  # (container id, ifname)
PASS = "install"  # the work queue's one key
RETRY_SECONDS = 0.5  # a pass that left endpoints dirty comes again this soon


class EndpointInstalls:
    """The endpoints queued for an install (``dirty``), those in an install now
    (``installing``), and what the writer reported installed on each (``installed``,
    ``generations``). Everything here is guarded by the enforcer's ``lock``."""

    def __init__(
        self,
        writer: PolicyWriter,
        lock: threading.RLock,
        endpoints: Mapping[EndpointKey, EndpointRecord],
        policy_of: Callable[[EndpointKey], EndpointPolicy],
        ready: threading.Event,
        observe: Callable[[str, float], None],
    ) -> None:
        self.writer = writer
        self.lock = lock
        self.endpoints = endpoints  # the enforcer's: an endpoint gone meanwhile is not recorded
        self.policy_of = policy_of  # what the endpoint's policy should be now
        self.ready = ready  # no pass installs anything before every source has synced
        self.observe = observe  # (what, seconds): metrics
        self.installed: dict[EndpointKey, EndpointPolicy] = {}
        self.generations: dict[EndpointKey, int] = {}
        self.dirty: set[EndpointKey] = set()
        self.installing: set[EndpointKey] = set()  # in an install_many now
        self._endpoint_locks: dict[EndpointKey, threading.Lock] = {}
        # One key: a pass installs every dirty endpoint in one batch, so changes during
        # a pass make one more pass after it.
        self._passes: WorkQueue[str] = WorkQueue()
        self._worker = Worker("enforcer", self._passes, self._pass, log)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(timeout=10)

    def queue(self, keys: set[EndpointKey]) -> None:
        """Mark these endpoints for the worker's next pass. Call with the lock held."""
        if keys:
            self.dirty |= keys
            self.add_pass()

    def add_pass(self) -> None:
        self._passes.add(PASS)

    def forget(self, key: EndpointKey) -> None:
        """The endpoint is gone. Call with the lock held."""
        self.installed.pop(key, None)
        self.generations.pop(key, None)
        self.dirty.discard(key)
        self._endpoint_locks.pop(key, None)

    def _endpoint_lock(self, key: EndpointKey) -> threading.Lock:
        with self.lock:
            return self._endpoint_locks.setdefault(key, threading.Lock())

    def install(
        self, keys: Iterable[EndpointKey]
    ) -> tuple[dict[EndpointKey, int], dict[EndpointKey, Exception]]:
        """Install the current policies of these endpoints (those not installed already)
        in one batch; return their generations and what failed (those stay dirty)."""
        keys = sorted(set(keys))
        generations: dict[EndpointKey, int] = {}
        failed: dict[EndpointKey, Exception] = {}
        with contextlib.ExitStack() as held:
            for key in keys:  # in order: two batches never wait for each other's locks
                held.enter_context(self._endpoint_lock(key))
            pending: dict[int, tuple[EndpointKey, EndpointRecord]] = {}
            desired: dict[int, EndpointPolicy] = {}
            with self.lock:
                for key in keys:
                    record = self.endpoints.get(key)
                    if record is None:
                        continue
                    self.dirty.discard(key)
                    started = time.perf_counter()
                    try:
                        policy = self.policy_of(key)
                    except PolicyIncomplete as err:  # keep what is installed
                        failed[key] = err
                        generations[key] = self.generations.get(key, 0)
                        continue
                    self.observe("compute", time.perf_counter() - started)
                    if self.installed.get(key) == policy:
                        generations[key] = self.generations.get(key, 0)
                        continue
                    pending[record.ifindex] = (key, record)
                    desired[record.ifindex] = policy
                    self.installing.add(key)  # from here until its install is over
            if not pending:
                return generations, failed
            rejected: dict[int, PolicyError] = {}
            crashed: Exception | None = None
            started = time.perf_counter()
            try:
                installed = self.writer.install_many(desired, rejected)
            except Exception as err:  # the datapath failed: every endpoint stays dirty
                installed, crashed = {}, err
            elapsed = time.perf_counter() - started
            self.observe("install_batch", elapsed)
            with self.lock:
                self.installing -= {key for key, _ in pending.values()}
                for ifindex, (key, record) in pending.items():
                    if ifindex not in installed:
                        failed[key] = rejected.get(ifindex) or crashed or RuntimeError("lost")
                        if key in self.endpoints:
                            self.dirty.add(key)
                        continue
                    # The batch's time, shared out: what one endpoint's install cost.
                    self.observe("install", elapsed / len(pending))
                    if self.endpoints.get(key) == record:
                        self.installed[key] = desired[ifindex]
                        self.generations[key] = installed[ifindex]
                    generations[key] = installed[ifindex]
        log.debug("installed %d policies in %.1f ms", len(installed), elapsed * 1000)
        return generations, failed

    def _pass(self, _key: str) -> float | None:
        """Install every dirty endpoint's policy in one batch; those that fail stay
        dirty and the pass comes again after RETRY_SECONDS (not in a tight loop)."""
        with self.lock:
            if not (self.ready.is_set() and self.dirty):
                return None  # mark_ready, or the next change, adds the pass again
            batch = sorted(self.dirty)
        try:
            _, failed = self.install(batch)
        except Exception as err:  # keep going; the endpoints stay dirty
            failed = dict.fromkeys(batch, err)
            with self.lock:
                self.dirty |= set(batch) & set(self.endpoints)
        # Incomplete inputs keep the installed policy; their arrival marks the pod again.
        failed = {k: e for k, e in failed.items() if not isinstance(e, PolicyIncomplete)}
        for key, error in failed.items():
            log.error("failed to install the policy of %s: %s", key, error)
        return RETRY_SECONDS if failed else None
