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
- every change marks the endpoints it may affect, and the batches of
  ``cni.agent.endpoint_installs`` install those whose policy differs from
  what is installed (the rules of an install are there);
- a resolver that lacks part of a pod's inputs (``PolicyIncomplete``: a
  controller's objects not all received) leaves the pod's installed policy
  as it is, and a new endpoint's ADD waits for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from cni.agent.endpoint_installs import EndpointInstalls, EndpointKey
from cni.agent.state import AgentState, EndpointRecord
from cni.datapath.interfaces import PolicyWriter
from cni.policy.errors import PolicyIncomplete
from cni.policy.index import PolicyIndex
from cni.policy.model import KubeObject, Pod, PodKey
from cni.policy.resolve import PodPolicyResolver, service_ips
from cni.policy.vocabulary import EndpointPolicy

log = logging.getLogger("sluice.agent")

NOT_ISOLATED = EndpointPolicy()


class NotReady(Exception):
    """The sources have not synced yet: no policy can be computed from a full view."""


class Enforcer:
    """The endpoints, the sources' pods and the resolver, kept consistent (the rules
    above); ``installs`` writes what they give. ``observe(what, seconds)``: metrics."""

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
        # Resolved here from every object (the default), or from a controller's objects.
        self.index: PodPolicyResolver = index if index is not None else PolicyIndex(node_name)
        self.lock = threading.RLock()  # the index, the sources' pods, the endpoints
        self.endpoints: dict[EndpointKey, EndpointRecord] = {}
        self.by_pod: dict[PodKey, EndpointKey] = {}
        self.source_pods: dict[PodKey, Pod] = {}
        # Pods the source deleted whose endpoint is still here: as last known, until DEL.
        self.departed_pods: dict[PodKey, Pod] = {}
        self._ready = threading.Event()
        self.installs = EndpointInstalls(
            writer, self.lock, self.endpoints, self.endpoint_policy, self._ready, observe
        )
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
        self.installs.start()

    def mark_ready(self) -> None:
        """Every source has synced: compute and install everything once."""
        with self.lock:
            for record in self.endpoints.values():
                if record.pod is not None:
                    self._index_pod(record.pod)
            self.installs.dirty |= set(self.endpoints)
            self._ready.set()
            self._write_service_ips()
        self.installs.add_pass()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            raise NotReady("the agent's policy sources have not synced yet")

    def stop(self) -> None:
        self.installs.stop()

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
            self.installs.installed.pop(record.key, None)  # a new veth: nothing on it yet
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
            self.installs.forget(key)
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
        _, failed = self.installs.install(keys)
        for err in failed.values():
            if not isinstance(err, PolicyIncomplete):
                raise err

    # -- verification (cni/agent/verify.py) -------------------------------------------------

    @property
    def installed(self) -> dict[EndpointKey, EndpointPolicy]:
        """What the writer reported installed on each endpoint. Read with the lock held."""
        return self.installs.installed

    @property
    def dirty(self) -> frozenset[EndpointKey]:
        """Endpoints queued for an install. Read with the lock held."""
        return frozenset(self.installs.dirty)

    @property
    def installing(self) -> frozenset[EndpointKey]:
        """Endpoints whose install is in flight. Read with the lock held."""
        return frozenset(self.installs.installing)

    def replace_index(self, index: PodPolicyResolver) -> None:
        """Resolve from ``index`` (rebuilt from the same objects) from now on, and
        install every endpoint's policy again from it."""
        with self.lock:
            self.index = index
            self.installs.installed.clear()
            self._queue(set(self.endpoints))

    def reinstall(self, key: EndpointKey) -> None:
        """Install the endpoint's policy again, whatever the enforcer thinks is there."""
        with self.lock:
            self.installs.installed.pop(key, None)
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
        self.installs.queue(keys)
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

    def _enforce(self, key: EndpointKey, must_install: bool = False) -> int:
        """Install the endpoint's current policy unless it is installed already. While
        the resolver lacks inputs, keep what the datapath has (``must_install``, a new
        endpoint that has nothing: NotReady)."""
        generations, failed = self.installs.install([key])
        if key in failed:
            err = failed[key]
            if isinstance(err, PolicyIncomplete):
                if must_install:
                    raise NotReady(str(err)) from None
                log.debug("keeping the installed policy of %s: %s", key, err)
                return self.installs.generations.get(key, 0)
            raise err
        return generations.get(key, 0)
