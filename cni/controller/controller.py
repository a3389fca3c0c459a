"""``sluicectl controller``: the cluster-wide policy resolver.

Informers (``informer``) keep Namespaces, Pods and NetworkPolicies, trimmed to
what the resolver reads, and the controller's own objects (a digest of each).
The ``Publisher`` takes every change (``desired``: the cluster's objects;
``ledger``: what is published) and plans what to write (``planner``); the
publishing loop writes it, while this process leads (``lease``):

- nothing is written, and so nothing deleted, before every collection has been
  listed once in this process (a restarted controller starts with empty caches:
  deleting from those would delete everything);
- a new term (leadership gained, or regained) starts by planning every object
  again and sweeping objects that belong to no policy, set or node the synced
  caches know; after that each change is planned as it comes;
- a plan writes address sets, then PolicyEndpoints, then PolicyTargets, and
  deletes last: an agent sees a set before a policy names it, and a policy
  before a pod's entry lists it;
- every write checks that this process still surely leads (``lease``: by time,
  so it holds while the API hangs) and must end by then; a lost lease, or one
  not renewed in time, stops the writing at once and the process waits as a
  standby, caches kept warm.

Status goes to the log: leadership, sync, each plan's writes, and every minute
the objects published.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni.controller.desired import PolicyRecord
from cni.controller.planner import ADDRESS_SET_CAPACITY, TARGETS_CAPACITY, Plan, Write
from cni.controller.publisher import Publisher
from cni.kube.api import Api, ApiError
from cni.kube.informer import Informer
from cni.kube.lease import LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS, LeaderElector
from cni.kube.memory import limit_malloc_arenas, release_free_memory
from cni.policy.model import Namespace, Pod
from cni.policy.parse import parse_namespace, parse_pod
from cni.policy.parse_policy import read_network_policy
from cni.policy.published.identity import INFO_TYPES, ShardInfo, shard_info
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    collection_path,
    object_path,
)

log = logging.getLogger("sluice.k8s")

STATUS_SECONDS = 60.0
BATCH_SECONDS = 0.05  # let a burst of events gather into one plan
WRITERS = 4  # concurrent API writes within one phase of a plan
MIN_WRITE_SECONDS = 0.1  # a write started with less time to lead than this is not started


def parse_policy_record(raw: dict[str, Any]) -> PolicyRecord:
    """A NetworkPolicy with its uid and generation (what its PolicyEndpoints record),
    read failing closed: what sluice cannot read is published as refused, so agents
    isolate what it selects (never dropped, which would unisolate its pods)."""
    meta = raw.get("metadata") or {}
    return PolicyRecord(
        read_network_policy(raw), str(meta.get("uid") or ""), int(meta.get("generation") or 1)
    )


# (collection, the kind of its objects, path, parse), as the agent's sources have them.
INPUTS: tuple[tuple[str, type, str, Callable[[dict[str, Any]], Any]], ...] = (
    ("namespaces", Namespace, "/api/v1/namespaces", parse_namespace),
    ("pods", Pod, "/api/v1/pods", parse_pod),
    (
        "networkpolicies",
        PolicyRecord,
        "/apis/networking.k8s.io/v1/networkpolicies",
        parse_policy_record,
    ),
    *(
        (kind, INFO_TYPES[kind], collection_path(kind), shard_info)
        for kind in (POLICY_ENDPOINTS, ADDRESS_SET, POLICY_TARGETS)
    ),
)


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class Controller:
    def __init__(
        self,
        api: Api,
        *,
        lease_namespace: str = "kube-system",
        lease_name: str = "sluice-controller",
        identity: str | None = None,
        capacity: int = ADDRESS_SET_CAPACITY,
        targets_capacity: int = TARGETS_CAPACITY,
        lease: float = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        retry: float = RETRY_SECONDS,
    ) -> None:
        self.api = api
        self.identity = identity or default_identity()
        self.publisher = Publisher(capacity, targets_capacity)
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self.kinds = {name: kind for name, kind, _, _ in INPUTS}
        self.informers = [Informer(api, name, path, parse, self) for name, _, path, parse in INPUTS]
        self.elector = LeaderElector(
            api,
            lease_namespace,
            lease_name,
            self.identity,
            lease=lease,
            renew_deadline=renew_deadline,
            retry=retry,
            on_started=self._leadership_changed,
            on_stopped=self._leadership_changed,
        )
        self.term = 0  # counts leadership terms; a plan belongs to one
        self.written: Counter[str] = Counter()  # verb -> objects, over the process's life
        self._synced_logged = False

    # -- life cycle ----------------------------------------------------------------------

    def run(self, stopping: threading.Event) -> None:
        """Watch, contend for the lease, and publish while leading, until ``stopping``."""
        log.info("controller %s starting", self.identity)
        limit_malloc_arenas()  # before the informers' and writers' threads (see memory)
        for informer in self.informers:
            informer.start()
        elector = threading.Thread(
            target=self.elector.run, args=(stopping,), name="lease", daemon=True
        )
        elector.start()
        try:
            self._publish_loop(stopping)
        finally:
            with self.lock:
                self._wake.notify_all()
            elector.join(timeout=self.elector.retry + 10)
            for informer in self.informers:
                informer.stop()
            log.info("controller %s stopped; %s", self.identity, self._written_text())

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def unsynced(self) -> list[str]:
        return [informer.kind for informer in self.informers if not informer.synced.is_set()]

    @property
    def leading(self) -> bool:
        """Whether this process surely leads now (by time: see ``lease``)."""
        return self.elector.is_leading()

    def _leadership_changed(self) -> None:
        with self.lock:
            self.term += 1
            self._wake.notify_all()

    # -- the informers' sink ----------------------------------------------------------------

    def replace(self, kind: str, items: list[Any]) -> None:
        with self.lock:
            self.publisher.replace_all(self.kinds[kind], items)
            self._wake.notify_all()

    def change(self, kind: str, event: str, item: Any) -> None:
        with self.lock:
            if event == "DELETED":
                self.publisher.delete(item)
            else:
                self.publisher.upsert(item)
            self._wake.notify_all()

    # -- publishing ---------------------------------------------------------------------------

    def _publish_loop(self, stopping: threading.Event) -> None:
        served = 0  # the term whose first full plan has been made
        full_plan = False  # the plan being made is a term's first, of every object
        next_status = time.monotonic() + STATUS_SECONDS
        while not stopping.is_set():
            with self.lock:
                ready = self.leading and self.synced()
                if not (ready and (served != self.term or self.publisher.pending())):
                    self._wake.wait(timeout=0.5)
                    ready = self.leading and self.synced()
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_SECONDS
                    self._log_status()
                if stopping.is_set() or not ready:
                    continue
                if self.synced() and not self._synced_logged:
                    self._synced_logged = True
                    log.info("every collection is synced: %s", self.publisher.desired.totals())
                term = self.term
                if served != term:
                    served = term
                    log.info("term %d: planning every object again, then each change", term)
                    self.publisher.recompute_everything()
                    full_plan = True
                elif not self.publisher.pending():
                    continue
            stopping.wait(BATCH_SECONDS)
            with self.lock:
                if term != self.term:
                    continue
                started = time.monotonic()
                plan = self.publisher.plan()
                planned = time.monotonic() - started
            if plan:
                self._execute(plan, term, planned)
            if full_plan:
                # Every object's body and the API's answers were made and dropped.
                full_plan = False
                release_free_memory()

    def _write_time(self, term: int) -> float | None:
        """Seconds a write may take, ending while this process surely leads in
        ``term``; None when it may not write at all."""
        seconds = self.elector.remaining()
        if not (self.leading and self.term == term) or seconds < MIN_WRITE_SECONDS:
            return None
        return seconds

    def _execute(self, plan: Plan, term: int, planned: float) -> None:
        started = time.monotonic()
        done: Counter[str] = Counter()
        phases: list[list[Write]] = [
            [w for w in plan.writes if w.kind == ADDRESS_SET],
            [w for w in plan.writes if w.kind == POLICY_ENDPOINTS],
            [w for w in plan.writes if w.kind == POLICY_TARGETS],
        ]
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="publish") as pool:
            for phase in phases:
                for verb in pool.map(lambda w: self._write(w, term), phase):
                    done[verb] += 1
            for verb in pool.map(lambda d: self._delete(d, term), plan.deletions):
                done[verb] += 1
        done.pop("", None)
        self.written.update(done)
        log.info(
            "published in %.2f s (planned in %.3f s): %s; %s objects published",
            time.monotonic() - started,
            planned,
            ", ".join(f"{verb} {n}" for verb, n in sorted(done.items())) or "nothing",
            self.publisher.published_count(),
        )

    def _write(self, write: Write, term: int) -> str:
        """Carry out one write; the verb done, "failed", or "" (not leading any more)."""
        timeout = self._write_time(term)
        if timeout is None:
            return ""
        path = object_path(write.kind, write.name)
        try:
            if write.verb == "create":
                stored = self.api.create(collection_path(write.kind), write.body, timeout=timeout)
            elif write.verb == "replace":
                stored = self.api.replace(path, write.body, timeout=timeout)
            else:
                labels = {"metadata": {"labels": write.labels_patch}}
                stored = self.api.patch(path, labels, timeout=timeout)
        except ApiError as err:
            log.warning("%s %s %s failed: %s; planning it again", write.verb, write.kind, path, err)
            with self.lock:
                self.publisher.replan(write)
            return "failed"
        with self.lock:
            self.publisher.observe(shard_info(stored))
        return {"create": "created", "replace": "replaced"}.get(write.verb, "relabelled")

    def _delete(self, info: ShardInfo, term: int) -> str:
        timeout = self._write_time(term)
        if timeout is None:
            return ""
        path = object_path(info.kind, info.name)
        try:
            self.api.delete(path, timeout=timeout)
        except ApiError as err:
            log.warning("delete %s failed: %s; planning it again", path, err)
            with self.lock:
                self.publisher.replan(info)
            return "failed"
        with self.lock:
            self.publisher.forget(info)
        return "deleted"

    # -- status ---------------------------------------------------------------------------------

    def _written_text(self) -> str:
        return "written: " + (
            ", ".join(f"{verb} {n}" for verb, n in sorted(self.written.items())) or "nothing"
        )

    def _log_status(self) -> None:
        log.info(
            "status: %s, %s; cluster %s; published %s; %s; pending %s",
            "leading" if self.leading else "standby",
            "synced" if self.synced() else f"not synced ({', '.join(self.unsynced())})",
            self.publisher.desired.totals(),
            self.publisher.ledger.count_by_kind(),
            self._written_text(),
            self.publisher.desired.changes.counts(),
        )
