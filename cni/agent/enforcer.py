"""Every local endpoint's policy: computed from what the agent knows, installed in
the datapath, kept up to date.

The agent knows objects from its sources (the local manifest store, or the
Kubernetes API) and its own endpoints (pods it wired, with their addresses).
A pod's view in the resolver is the source's Pod (labels, container ports)
with the endpoint's addresses; a pod the runtime named but no source knows
has no labels. An endpoint serving no named pod (cnitool, ``ctr run``) is
selected by no policy: it is not isolated.

Consistency rules:

- nothing is computed before every source has synced once (``ready``): an
  ADD waits for it, and what the datapath already holds (pinned, from before
  a restart: policies, the set of Service ClusterIPs) stays as it is until
  then; no datapath write derived from the sources' objects happens before;
- a pod the source deletes while its sandbox still runs here (its endpoint
  is up until the CNI DEL) keeps its last known labels and ports until that
  DEL: a pod being deleted stays selected by the policies that selected it;
- a new endpoint's policy is installed before its veth is up (the ADD's
  policy step, ``cni.plugin.verbs.add.PolicyStep``), so no packet crosses it
  unjudged;
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
- a resolver that lacks part of a pod's inputs (``PolicyIncomplete``: a
  controller's objects not all received) leaves the pod's installed policy
  as it is, and a new endpoint's ADD waits for them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from cni.agent.state import AgentState, EndpointRecord
from cni.datapath.interfaces import PolicyWriter
from cni.policy.errors import PolicyIncomplete
from cni.policy.model import KubeObject, Pod, PodKey
from cni.policy.resolve import PodPolicyResolver, PolicyIndex, service_ips
from cni.policy.vocabulary import EndpointPolicy, PolicyError
from cni.work.queue import Worker, WorkQueue

log = logging.getLogger("sluice.agent")

EndpointKey = tuple[str, str]  # (container id, ifname)
NOT_ISOLATED = EndpointPolicy()
PASS = "install"  # the work queue's one key
RETRY_SECONDS = 0.5  # a pass that left endpoints dirty comes again this soon


class NotReady(Exception):
    """The sources have not synced yet: no policy can be computed from a full view."""


class Enforcer:
    def __init__(
        self,
        writer: PolicyWriter,
        state: AgentState,
        node_name: str,
        observe: Callable[[str, float], None] = lambda name, seconds: None,
        index: PodPolicyResolver | None = None,
    ) -> None:
        self.writer = writer  # the datapath, as far as the enforcer sees it
        self.state = state
        self.node_name = node_name
        self.observe = observe  # (what, seconds): metrics
        # Resolved here from every object (the default), or from a controller's objects.
        self.index: PodPolicyResolver = index if index is not None else PolicyIndex(node_name)
        self.lock = threading.RLock()  # the index, the sources' pods, the endpoints
        self.endpoints: dict[EndpointKey, EndpointRecord] = {}
        self.by_pod: dict[PodKey, EndpointKey] = {}
        self.source_pods: dict[PodKey, Pod] = {}
        # Pods the source deleted whose endpoint is still here: as last known, until DEL.
        self.departed_pods: dict[PodKey, Pod] = {}
        self.installed: dict[EndpointKey, EndpointPolicy] = {}
        self.generations: dict[EndpointKey, int] = {}
        self._endpoint_locks: dict[EndpointKey, threading.Lock] = {}
        self._dirty: set[EndpointKey] = set()
        self._installing: set[EndpointKey] = set()  # in an install_many now
        # One key: a pass installs every dirty endpoint in one batch, so changes during
        # a pass make one more pass after it.
        self._passes: WorkQueue[str] = WorkQueue()
        self._worker = Worker("enforcer", self._passes, self._pass, log)
        self._ready = threading.Event()
        self._service_ips: frozenset[str] | None = None
        # A source that knows every pod (the API): a pod it does not know yet is not
        # wired, since its labels, and so its policy, are unknown.
        self.require_known_pods = False
        self._pods_known = threading.Condition(self.lock)

    # -- life cycle --------------------------------------------------------------------

    def start(self, endpoints: Iterable[EndpointRecord]) -> None:
        """Adopt the endpoints found at start (their pinned policies keep working) and
        start the worker; nothing is recomputed before ``mark_ready``."""
        with self.lock:
            for record in endpoints:
                self.endpoints[record.key] = record
                if record.pod is not None:
                    self.by_pod[record.pod] = record.key
        self._worker.start()

    def mark_ready(self) -> None:
        """Every source has synced: compute and install everything once."""
        with self.lock:
            for record in self.endpoints.values():
                if record.pod is not None:
                    self._index_pod(record.pod)
            self._dirty |= set(self.endpoints)
            self._ready.set()
            self._write_service_ips()
        self._passes.add(PASS)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            raise NotReady("the agent's policy sources have not synced yet")

    def stop(self) -> None:
        self._worker.stop(timeout=10)

    # -- sources -----------------------------------------------------------------------

    def change(
        self, upserts: Iterable[KubeObject], deletes: Iterable[KubeObject]
    ) -> set[EndpointKey]:
        """Apply objects from a source; return the endpoints whose policy may change
        (they are queued for the worker)."""
        with self.lock:
            affected: set[PodKey] = set()
            for obj in deletes:
                if isinstance(obj, Pod):
                    last = self.source_pods.pop(obj.key, None)
                    if obj.key in self.by_pod:  # its sandbox still runs here: until its DEL
                        self.departed_pods[obj.key] = last or obj
                    affected |= self._index_pod(obj.key)
                else:
                    affected |= self.index.delete(obj)
            for obj in upserts:
                if isinstance(obj, Pod):
                    self.source_pods[obj.key] = obj
                    self.departed_pods.pop(obj.key, None)
                    affected |= self._index_pod(obj.key)
                else:
                    affected |= self.index.upsert(obj)
            self._pods_known.notify_all()  # a waiting ADD's pod, or its policy's inputs
            keys = self._endpoints_of(affected)
            self._queue(keys)
            return keys

    def replace_all(self, kind: type, objects: list[Any]) -> None:
        """Make a source's objects of ``kind`` exactly ``objects`` (a relist)."""
        with self.lock:
            if kind is Pod:
                current = set(self.source_pods)
                wanted = {obj.key for obj in objects if isinstance(obj, Pod)}
                gone = [self.source_pods[k] for k in current - wanted]
                self.change(objects, gone)
                return
            affected = self.index.replace_all(kind, objects)
            self._pods_known.notify_all()
            self._queue(self._endpoints_of(affected))

    # -- endpoints (the CNI verbs) -----------------------------------------------------------

    def endpoint_up(self, record: EndpointRecord, wait: float = 30.0) -> int:
        """A new endpoint, before its veth is up: remember it and install its policy
        now; queue the endpoints whose peers it changes. Returns its generation."""
        self.wait_ready(wait)
        if self.require_known_pods and record.pod is not None:
            self._wait_known(record.pod, wait, record.ips)
        self.state.put_endpoint(record)
        with self.lock:
            old = self.endpoints.get(record.key)
            if old is not None and old.pod is not None and old.pod != record.pod:
                self.by_pod.pop(old.pod, None)
            self.endpoints[record.key] = record
            self.installed.pop(record.key, None)  # a new veth: nothing installed on it yet
            affected: frozenset[PodKey] = frozenset()
            if record.pod is not None:
                self.by_pod[record.pod] = record.key
                affected = self._index_pod(record.pod)
            self._queue(self._endpoints_of(affected) - {record.key})
        return self._enforce(record.key, must_install=True)

    def _wait_known(self, pod: PodKey, wait: float, ips: tuple[str, ...] = ()) -> None:
        """Until the source knows the pod, the resolver has every input of its policy,
        and no other pod still holds one of its addresses (an identity to inherit)."""
        with self.lock:
            if not self._pods_known.wait_for(
                lambda: (
                    pod in self.source_pods
                    and self.index.incomplete(pod) is None
                    and self.index.address_held(pod, ips) is None
                ),
                timeout=wait,
            ):
                if pod not in self.source_pods:
                    raise NotReady(f"the agent does not know pod {pod[0]}/{pod[1]} yet")
                held = self.index.address_held(pod, ips)
                raise NotReady(
                    f"the policy of pod {pod[0]}/{pod[1]} is not known yet: "
                    f"{held or self.index.incomplete(pod)}"
                )

    def endpoint_gone(self, key: EndpointKey) -> None:
        """DEL or GC removed the endpoint: forget it; its pod's addresses go from the
        other endpoints' peers."""
        self.state.remove_endpoint(key)
        with self.lock:
            record = self.endpoints.pop(key, None)
            self.installed.pop(key, None)
            self.generations.pop(key, None)
            self._dirty.discard(key)
            self._endpoint_locks.pop(key, None)
            if record is None or record.pod is None:
                return
            if self.by_pod.get(record.pod) == key:
                del self.by_pod[record.pod]
                self.departed_pods.pop(record.pod, None)
            self._queue(self._endpoints_of(self._index_pod(record.pod)))

    def endpoint_policy(self, key: EndpointKey) -> EndpointPolicy:
        """What the endpoint's policy should be now."""
        with self.lock:
            record = self.endpoints.get(key)
            if record is None or record.pod is None:
                return NOT_ISOLATED
            return self.index.resolve(record.pod).endpoint

    def enforce_now(self, keys: Iterable[EndpointKey]) -> None:
        """Install these endpoints' policies before returning (``sluicectl apply``).
        An endpoint whose inputs are incomplete keeps its installed policy."""
        _, failed = self._enforce_many(keys)
        for err in failed.values():
            if not isinstance(err, PolicyIncomplete):
                raise err

    # -- verification (cni/agent/verify.py) -------------------------------------------------

    @property
    def dirty(self) -> frozenset[EndpointKey]:
        """Endpoints queued for an install. Read with the lock held."""
        return frozenset(self._dirty)

    @property
    def installing(self) -> frozenset[EndpointKey]:
        """Endpoints whose install is in flight. Read with the lock held."""
        return frozenset(self._installing)

    def replace_index(self, index: PodPolicyResolver) -> None:
        """Resolve from ``index`` (rebuilt from the same objects) from now on, and
        install every endpoint's policy again from it."""
        with self.lock:
            self.index = index
            self.installed.clear()
            self._queue(set(self.endpoints))

    def reinstall(self, key: EndpointKey) -> None:
        """Install the endpoint's policy again, whatever the enforcer thinks is there."""
        with self.lock:
            self.installed.pop(key, None)
            self._queue({key})

    def rewrite_service_ips(self) -> None:
        with self.lock:
            self._service_ips = None
            self._write_service_ips()

    # -- internals -----------------------------------------------------------------------

    def _index_pod(self, key: PodKey) -> frozenset[PodKey]:
        """Put the pod's current view into the index (or take it out): the source's
        object with the local endpoint's addresses. Call with the lock held."""
        source = self.source_pods.get(key)
        endpoint = self.endpoints.get(self.by_pod[key]) if key in self.by_pod else None
        if endpoint is not None:
            base = source or self.departed_pods.get(key) or Pod(namespace=key[0], name=key[1])
            return self.index.upsert_pod(
                replace(base, ips=endpoint.ips, node_name=self.node_name, host_network=False)
            )
        if source is not None:
            if source.node_name == self.node_name and not source.host_network:
                # Scheduled here but not (or no longer) wired: its addresses, if the source
                # still reports any, are no pod's on this node.
                source = replace(source, node_name="")
            return self.index.upsert_pod(source)
        return self.index.delete_pod(key)

    def _endpoints_of(self, pods: Iterable[PodKey]) -> set[EndpointKey]:
        return {self.by_pod[p] for p in pods if p in self.by_pod}

    def _queue(self, keys: set[EndpointKey]) -> None:
        if keys:
            self._dirty |= keys
            self._passes.add(PASS)
        self._write_service_ips()

    def _write_service_ips(self) -> None:
        """The datapath's set of ClusterIPs, from the index: only once every source has
        synced (a restarted agent that wrote it from a partial list would empty it, and
        egress-isolated pods would lose DNS and Services until the Services came)."""
        if not self._ready.is_set():
            return
        services = service_ips(self.index)
        if services == self._service_ips:
            return
        try:
            self.writer.set_service_addresses(services)
        except OSError as err:  # kept as unwritten: the next change (or verify) tries again
            log.error("failed to write the Services' addresses: %s", err)
            return
        self._service_ips = services

    def _endpoint_lock(self, key: EndpointKey) -> threading.Lock:
        with self.lock:
            return self._endpoint_locks.setdefault(key, threading.Lock())

    def _enforce(self, key: EndpointKey, must_install: bool = False) -> int:
        """Install the endpoint's current policy unless it is installed already. While
        the resolver lacks inputs, keep what the datapath has (``must_install``, a new
        endpoint that has nothing: NotReady)."""
        generations, failed = self._enforce_many([key])
        if key in failed:
            err = failed[key]
            if isinstance(err, PolicyIncomplete):
                if must_install:
                    raise NotReady(str(err)) from None
                log.debug("keeping the installed policy of %s: %s", key, err)
                return self.generations.get(key, 0)
            raise err
        return generations.get(key, 0)

    def _enforce_many(
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
                    self._dirty.discard(key)
                    started = time.perf_counter()
                    try:
                        policy = self.endpoint_policy(key)
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
                    self._installing.add(key)  # from here until its install is over
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
                self._installing -= {key for key, _ in pending.values()}
                for ifindex, (key, record) in pending.items():
                    if ifindex not in installed:
                        failed[key] = rejected.get(ifindex) or crashed or RuntimeError("lost")
                        if key in self.endpoints:
                            self._dirty.add(key)
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
            if not (self._ready.is_set() and self._dirty):
                return None  # mark_ready, or the next change, adds the pass again
            batch = sorted(self._dirty)
        try:
            _, failed = self._enforce_many(batch)
        except Exception as err:  # keep going; the endpoints stay dirty
            failed = dict.fromkeys(batch, err)
            with self.lock:
                self._dirty |= set(batch) & set(self.endpoints)
        # Incomplete inputs keep the installed policy; their arrival marks the pod again.
        failed = {k: e for k, e in failed.items() if not isinstance(e, PolicyIncomplete)}
        for key, error in failed.items():
            log.error("failed to install the policy of %s: %s", key, error)
        return RETRY_SECONDS if failed else None

    # -- views ------------------------------------------------------------------------------

    def describe_endpoints(self) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for key, record in sorted(self.endpoints.items()):
                installed = self.installed.get(key)
                out.append(
                    {
                        "pod": "/".join(record.pod) if record.pod else None,
                        "containerID": record.container_id,
                        "ifname": record.ifname,
                        "ifindex": record.ifindex,
                        "ips": list(record.ips),
                        "ingressIsolated": bool(installed and installed.ingress is not None),
                        "egressIsolated": bool(installed and installed.egress is not None),
                        "policies": ["/".join(p) for p in self._selected_by(record.pod)],
                        "generation": self.generations.get(key),
                        "pending": key in self._dirty or installed is None,
                    }
                )
            return out

    def describe_policies(self) -> list[dict[str, Any]]:
        """Every policy, with the local pods it selects."""
        with self.lock:
            local = {record.pod: record for record in self.endpoints.values() if record.pod}
            out = []
            for key, found in sorted(self.index.store.policies.items()):
                selects = ["/".join(pod) for pod in sorted(local) if key in self._selected_by(pod)]
                out.append(
                    {
                        "policy": "/".join(key),
                        "policyTypes": [d for d in ("ingress", "egress") if found.isolates(d)],
                        "ingressRules": len(found.rules("ingress")),
                        "egressRules": len(found.rules("egress")),
                        "localPods": selects,
                        "refused": list(found.refusals),  # what it could not read, and why
                    }
                )
            return out

    def _selected_by(self, pod: PodKey | None) -> list[PodKey]:
        if pod is None:
            return []
        found = self.index.pod(pod)
        return list(self.index.selecting_policies(found)) if found else []
