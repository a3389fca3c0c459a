"""What the agent does for each request on its socket.

``cni_call``: a CNI call forwarded by the ``sluice`` executable, run exactly as the
plugin would run it (same parsing, same verbs, same error JSON), with the
policy hooks: ADD installs the pod's policy before its veth is up, DEL and GC
forget endpoints, CHECK also compares the installed policy, STATUS also says
whether the agent is ready. Calls for one attachment are serialised; calls
for different attachments run at once.

``apply``, ``delete``, ``get``, ``explain``, ``status``, ``verify``: sluicectl's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cni.agent import log_fields
from cni.agent.enforcer import Enforcer, NotReady
from cni.agent.enforcer_views import describe_endpoints, describe_policies
from cni.agent.local_store import LocalStore
from cni.agent.retire import Retirer
from cni.agent.state import EndpointRecord
from cni.datapath.maps import Datapath
from cni.plugin import frames, ipam_client, netconf, release
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import add, check, delete, gc, status
from cni.spec.attachment import Attachment
from cni.spec.call import execute
from cni.spec.errors import (
    ERR_CHECK_FAILED,
    ERR_INVALID_CONFIG,
    ERR_NO_ADDRESS,
    ERR_NOT_AVAILABLE,
    ERR_TRY_AGAIN,
    CNIError,
)
from cni.spec.protocol import Request, prev_result, requested_mac, valid_attachments
from cni.spec.result import Result

log = logging.getLogger("sluice.agent")

READY_WAIT = 30.0  # an ADD waits this long for the sources to sync


class RequestHandlers:
    def __init__(
        self,
        conf: NetConf,
        enforcer: Enforcer,
        local_store: LocalStore | None,
        metrics: Any,
        api_source: Any = None,
        *,
        datapath: Datapath,
        allocators: ipam_client.KeptAllocators | None = None,
    ) -> None:
        self.conf = conf
        # The agent's handles, passed to every verb: its datapath and its open allocators.
        self.datapath = datapath
        self.allocators = allocators
        self.enforcer = enforcer
        self.local_store = local_store
        self.metrics = metrics
        self.api_source = api_source
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.retirer = Retirer()  # finishes the DELs that answered once their pair was cut off

    def close(self) -> None:
        """Finish the deletions DEL left behind."""
        self.retirer.close()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("v") != frames.VERSION:
            return {"error": f"unsupported protocol version {request.get('v')!r}"}
        op = request.get("op")
        handler = {
            "status": self.status,
            "apply": self.apply,
            "delete": self.delete,
            "get": self.get,
            "explain": self.explain,
            "verify": self.verify,
        }.get(op)  # type: ignore[arg-type]
        if handler is None:
            return {"error": f"unknown op {op!r}"}
        return handler(request)

    # -- CNI ------------------------------------------------------------------------------

    def cni_call(self, env: dict[str, str], stdin: bytes) -> tuple[int, str, str]:
        """A CNI call forwarded by the executable: (exit code, stdout, stderr)."""
        started = time.perf_counter()
        # Every line logged meanwhile names the call; no veth of an answered DEL is
        # deleted meanwhile.
        verb = env.get("CNI_COMMAND", "")
        with log_fields.for_call(env):
            with self.retirer.call():
                rc, out = execute(env, stdin, self._verb)
            if rc != 0:
                # STATUS fails every few seconds while the agent is not ready: quieter.
                level = logging.DEBUG if verb == "STATUS" else logging.WARNING
                log.log(level, "%s failed: %s", verb or "a call", log_fields.error_of(out))
        self.metrics.cni_call(verb, rc, time.perf_counter() - started)
        return rc, out, ""

    def _verb(self, request: Request) -> dict[str, Any] | None:
        if request.command in ("ADD", "CHECK", "STATUS"):  # DEL and GC must always run
            mismatch = release.caller_mismatch(request.env.get(release.CALLER_KEY))
            if mismatch is not None:
                raise CNIError(ERR_TRY_AGAIN, mismatch)
        conf = netconf.from_request(request)
        if conf.network != self.conf.network:
            raise CNIError(
                ERR_INVALID_CONFIG,
                f'this agent serves network "{self.conf.network}", not "{conf.network}"',
            )
        if request.command == "STATUS":
            self._require_ready(ERR_NOT_AVAILABLE)  # STATUS's code for "no ADD now"
            status.status(conf, datapath=self.datapath, allocators=self.allocators)
            return None
        if request.command == "GC":
            self.retirer.drain()  # releases DEL has left running go first
            valid = valid_attachments(request.config)
            gc.gc(conf, valid, datapath=self.datapath, allocators=self.allocators)
            for key in list(self.enforcer.endpoints):
                if key not in valid:
                    self.enforcer.endpoint_gone(key)
            return None
        attachment = request.attachment
        with self._lock(attachment.key):
            if request.command == "ADD":
                return self._add(conf, request)
            if request.command == "DEL":
                try:
                    prev = prev_result(request)
                except CNIError:
                    prev = None
                self.retirer.wait(attachment.key)  # a repeated DEL finds the first one done
                delete.delete(
                    conf,
                    attachment,
                    prev,
                    datapath=self.datapath,
                    allocators=self.allocators,
                    defer=self.retirer.defer(attachment.key),
                )
                self.enforcer.endpoint_gone(attachment.key)
                return None
            prev = prev_result(request)
            if prev is None:
                raise CNIError(ERR_INVALID_CONFIG, "CHECK needs the ADD result as prevResult")
            check.check(conf, attachment, prev, datapath=self.datapath, allocators=self.allocators)
            self._check_policy(attachment.key)
            return None

    def _add(self, conf: NetConf, request: Request) -> dict[str, Any]:
        self._require_ready(ERR_TRY_AGAIN)  # as when the pod's own inputs are missing
        attachment = request.attachment
        self.retirer.wait(attachment.key)  # a DEL's veth of the same name is gone first

        def run_add() -> Result:
            return add.add(
                conf,
                attachment,
                prev_result(request),
                requested_mac(request),
                datapath=self.datapath,
                allocators=self.allocators,
                policy=EnforcedPolicy(self.enforcer, attachment),
            )

        finished, _ = self.retirer.progress()
        try:
            result = run_add()
        except CNIError as err:
            # Addresses of answered DELs may have been on their way back: once they
            # are, the pool may have room again.
            now_finished, pending = self.retirer.progress()
            if err.code != ERR_NO_ADDRESS or not (pending or now_finished != finished):
                raise
            self.retirer.drain()
            result = run_add()
        return result.to_json(request.cni_version)

    def _check_policy(self, key: tuple[str, str]) -> None:
        from cni.policy.errors import PolicyIncomplete

        try:
            desired = self.enforcer.endpoint_policy(key)
        except PolicyIncomplete:
            return  # the installed policy stays until the resolver's inputs are complete
        installed = self.enforcer.installed.get(key)
        if installed != desired:
            raise CNIError(
                ERR_CHECK_FAILED, f"the policy of {key[0]}/{key[1]} is not installed yet"
            )

    def _require_ready(self, code: int) -> None:
        """Wait a little for the sources to sync; else fail with ``code``."""
        if not self.enforcer.ready:
            try:
                self.enforcer.wait_ready(READY_WAIT)
            except NotReady as err:
                raise CNIError(code, str(err)) from None

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- sluicectl --------------------------------------------------------------------------

    def status(self, request: dict[str, Any]) -> dict[str, Any]:
        ready = self.enforcer.ready
        source = "the Kubernetes API" if self.api_source else "the local manifest store"
        waiting = self.api_source.unsynced() if self.api_source else []
        refused = dict(self.local_store.refused) if self.local_store else {}
        return {
            "ready": ready,
            "reason": None if ready else f"not synced yet: {', '.join(waiting) or 'starting'}",
            "summary": f"network {self.conf.network}, {len(self.enforcer.endpoints)} endpoints, "
            f"objects from {source}, {'ready' if ready else 'syncing'}",
            "refusedObjects": refused,  # stored objects that could not be read: why
        }

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.local_store is None:
            return {"error": "this agent takes its objects from the Kubernetes API"}
        return self._change(request, self.local_store.apply)

    def delete(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.local_store is None:
            return {"error": "this agent takes its objects from the Kubernetes API"}
        return self._change(request, self.local_store.delete)

    def _change(self, request: dict[str, Any], change: Any) -> dict[str, Any]:
        from cni.policy.errors import PolicyInputError

        text = request.get("manifest")
        if not isinstance(text, str):
            return {"error": "manifest must be a string"}
        try:
            names, affected = change(text)
        except PolicyInputError as err:
            return {"error": str(err)}
        started = time.perf_counter()
        self.enforcer.enforce_now(affected)  # returns once the datapath enforces it
        return {
            "objects": names,
            "endpoints": len(affected),
            "seconds": round(time.perf_counter() - started, 4),
        }

    def get(self, request: dict[str, Any]) -> dict[str, Any]:
        what = request.get("what")
        if what == "endpoints":
            return {"endpoints": describe_endpoints(self.enforcer)}
        if what == "policies":
            return {"policies": describe_policies(self.enforcer)}
        return {"error": f"unknown kind {what!r}: expected endpoints or policies"}

    def explain(self, request: dict[str, Any]) -> dict[str, Any]:
        from cni.policy import explain

        pod = request.get("pod")
        if not isinstance(pod, str) or pod.count("/") != 1:
            return {"error": f"pod must be NAMESPACE/NAME, not {pod!r}"}
        key = tuple(pod.split("/"))
        flow = request.get("flow")
        from cni.policy.index import PolicyIndex

        if not isinstance(self.enforcer.index, PolicyIndex):
            return {"error": "explain needs the agent's own resolution (--resolver agent)"}
        with self.enforcer.lock:
            if self.enforcer.index.pod(key) is None:  # type: ignore[arg-type]
                return {"error": f"the agent knows no pod {pod}"}
            if flow is None:
                found = explain.explain(self.enforcer.index, key)  # type: ignore[arg-type]
                return {"explanation": found.to_dict(), "text": found.to_text()}
            try:
                decided = explain.verdict(
                    self.enforcer.index,
                    key,  # type: ignore[arg-type]
                    flow["direction"],
                    flow["address"],
                    int(flow["port"]),
                    flow["protocol"],
                )
            except (KeyError, TypeError, ValueError) as err:
                return {"error": f"bad flow {flow!r}: {err}"}
            return {"verdict": decided.to_dict()}

    def verify(self, request: dict[str, Any]) -> dict[str, Any]:
        """Compare the live datapath with a computation from scratch (cni/agent/verify.py);
        with ``repair``, make the differences good."""
        from cni.agent import verify

        try:
            report, rebuilt = verify.verify(self.enforcer)
        except verify.Busy as err:
            return {"error": str(err)}
        if request.get("repair") and report.differences:
            verify.repair(self.enforcer, report, rebuilt)
        return {"report": report.to_json()}


class EnforcedPolicy:
    """ADD's policy step through the enforcer: the endpoint is tracked and its policy
    installed before the veth is up; ``remove`` forgets it when the ADD is undone."""

    def __init__(self, enforcer: Enforcer, attachment: Attachment) -> None:
        self.enforcer = enforcer
        self.attachment = attachment

    def install(self, ifindex: int, ips: list[str]) -> None:
        record = EndpointRecord(
            self.attachment.container_id,
            self.attachment.ifname,
            ifindex,
            tuple(ips),
            self.attachment.pod_namespace,
            self.attachment.pod_name,
        )
        try:
            self.enforcer.endpoint_up(record, READY_WAIT)
        except NotReady as err:
            raise CNIError(ERR_TRY_AGAIN, str(err)) from None

    def remove(self) -> None:
        self.enforcer.endpoint_gone(self.attachment.key)
