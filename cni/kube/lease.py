"""Leader election through a ``coordination.k8s.io/v1`` Lease, as Kubernetes' own
controllers do it.

The leader renews the Lease every ``retry`` seconds. A standby takes it over only
when it has seen the same record (holder and renew time) unchanged for a whole
``lease`` duration, measured on its own monotonic clock (never by comparing
clocks of two machines). Every write is a compare-and-swap on the Lease's
resourceVersion: of two contenders one wins.

A leader is sure that it leads for ``renew_deadline`` seconds (shorter than
``lease``) after the start of its last successful renewal, on its monotonic
clock: a standby can see that renewal only after it was sent, and waits a whole
``lease`` from then. ``is_leading()`` is that test, and it holds by time alone,
so it turns false in time even while the elector's request hangs on a server
that does not answer; the elector's requests time out by the end of that time.
Any failure of an attempt (the API's, a credential plugin's, an unexpected
answer) counts as a failed renewal, never ends the elector, and once the time
is up the leader stops leading (``on_stopped``) before it tries again. On a
clean stop the leader releases the Lease (no holder), so a standby takes over
at its next try instead of waiting out the duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cni.kube.api import Api, ApiError

log = logging.getLogger("sluice.k8s")

LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0


def micro_time(when: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: Api,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease: float = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        retry: float = RETRY_SECONDS,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
    ) -> None:
        if not retry < renew_deadline < lease:
            raise ValueError(
                f"leader election needs retry ({retry} s) < renew deadline ({renew_deadline} s)"
                f" < lease duration ({lease} s)"
            )
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease = lease
        self.renew_deadline = renew_deadline
        self.retry = retry
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.leading = threading.Event()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._sure_until = 0.0  # monotonic: the end of the time this process surely leads

    def is_leading(self) -> bool:
        """True while this process surely holds the lease; writes depend on it."""
        return self.leading.is_set() and time.monotonic() < self._sure_until

    def remaining(self) -> float:
        """Seconds this process still surely leads (0 when it does not)."""
        return max(0.0, self._sure_until - time.monotonic()) if self.leading.is_set() else 0.0

    def run(self, stopping: threading.Event) -> None:
        """Try to lead, then keep leading, until ``stopping``; release on the way out."""
        try:
            while not stopping.is_set():
                try:
                    self._attempt()
                except Exception:  # a bug (in a callback?): keep contending, not leading
                    log.exception("lease %s/%s: unexpected failure", self.namespace, self.name)
                    if self.leading.is_set():
                        self._stop_leading("unexpected failure")
                stopping.wait(self.retry)
        finally:
            # However the loop ended, this process does not lead any more.
            if self.leading.is_set():
                self._stop_leading("stopping")
                if stopping.is_set():
                    self.release()

    def _attempt(self) -> None:
        started = time.monotonic()
        if self.leading.is_set() and started >= self._sure_until:
            self._stop_leading("could not renew the lease in time")
        # A leader's request must end while it is still sure; a standby's within the
        # renew deadline, so that a hung server does not hold its elector either.
        timeout = self.remaining() if self.leading.is_set() else self.renew_deadline
        try:
            ok = self._try_acquire_or_renew(timeout)
        except Exception as err:  # not sure of the lease: the same as not renewed
            log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            ok = False
        now = time.monotonic()
        if self.leading.is_set() and now >= self._sure_until:
            # The attempt outlasted the time this process was sure: its writes stopped
            # meanwhile, so leading again (even on this renewal) is a new term.
            self._stop_leading("could not renew the lease in time")
        if ok and now < started + self.renew_deadline:
            self._sure_until = started + self.renew_deadline
            if not self.leading.is_set():
                log.info("leading: %s holds lease %s/%s", self.identity, self.namespace, self.name)
                self.leading.set()
                self.on_started()
        elif self.leading.is_set() and self._taken_over():
            self._stop_leading("another contender holds the lease")

    def _stop_leading(self, why: str) -> None:
        log.warning("no longer leading (%s)", why)
        self.leading.clear()
        self.on_stopped()

    def _taken_over(self) -> bool:
        return self._observed is not None and self._observed[0] not in ("", self.identity)

    def _try_acquire_or_renew(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout

        def left() -> float:
            rest = deadline - time.monotonic()
            if rest <= 0:
                raise ApiError(0, f"lease {self.namespace}/{self.name}: out of time")
            return rest

        lease = self.api.get(self.path, timeout=left())
        now = time.time()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquired=micro_time(now), transitions=0),
            }
            try:
                self.api.create(self.collection, body, timeout=left())
            except ApiError as err:
                if err.status == 409:  # another contender created it first
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or self.lease)
        if holder and holder != self.identity and time.monotonic() < self._observed_at + duration:
            return False  # held, and its holder renewed it within the duration
        mine = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = str(spec.get("acquireTime") or "") if mine else micro_time(now)
        lease["spec"] = self._spec(now, acquired=acquired, transitions=transitions)
        try:
            updated = self.api.replace(self.path, lease, timeout=left())
        except ApiError as err:
            if err.status == 409:  # someone else wrote it since we read it
                return False
            raise
        new_spec = updated.get("spec") or {}
        self._observed = (self.identity, str(new_spec.get("renewTime") or ""))
        self._observed_at = time.monotonic()
        return True

    def _spec(self, now: float, *, acquired: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease)),
            "acquireTime": acquired,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        """Give the lease up (no holder), so that a standby need not wait it out."""
        try:
            lease = self.api.get(self.path, timeout=self.renew_deadline)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = lease["spec"]
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = micro_time()
            self.api.replace(self.path, lease, timeout=self.renew_deadline)
            log.info("released lease %s/%s", self.namespace, self.name)
        except ApiError as err:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, err)
