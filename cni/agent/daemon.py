"""The agent's process: start, serve, stop.

Start: the datapath is loaded (compiled only if what is pinned is not this
build's) and adopted with its live maps, so established flows and installed
policies keep working through a restart; its reaper starts (it keeps a pool
of empty conntrack tables stocked and deletes what no endpoint uses any
more, off the CNI path); the endpoints recorded before are adopted if their
veths still exist; the sources sync; only then is every policy recomputed
and reinstalled; then the socket opens. Every ``verify_interval`` seconds the
live datapath is compared with a computation from scratch and what drifted is
repaired (cni/agent/verify.py). SIGTERM and SIGINT stop it cleanly:
the socket closes, the pinned datapath stays, and so do the routes to other
nodes (cni/agent/routes.py), which the next agent adopts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from cni.agent import log_fields, prefix_claims, routes
from cni.agent.enforcer import Enforcer
from cni.agent.handlers import RequestHandlers
from cni.agent.http_listener import Listener
from cni.agent.instance_lock import InstanceLock
from cni.agent.kube_source import COLLECTIONS, KubernetesSource
from cni.agent.local_store import LocalStore
from cni.agent.pod_ranges import PodRangeKeeper
from cni.agent.server import AgentServer, prepare_directory
from cni.agent.shard_source import controller_collections
from cni.agent.state import AgentState, EndpointRecord
from cni.datapath import after_nat, bpf, loader, uplink
from cni.datapath.maps import Datapath
from cni.datapath.policy_writer import DatapathPolicyWriter
from cni.datapath.reaper import Reaper
from cni.kube.api import Api
from cni.kube.memory import limit_malloc_arenas
from cni.net import link
from cni.net.kernel_routing import KernelRouting
from cni.net.netlink import node_socket
from cni.plugin import ipam_client, podnet
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import delete
from cni.policy.published.index import ShardIndex
from cni.spec.attachment import Attachment
from cni.spec.errors import CNIError
from ipam.config import NodeCIDRConfig

log = logging.getLogger("sluice.agent")


class JSONLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the fields of the CNI
    call being served (``cni.agent.log_fields``), and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **log_fields.current(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONLines())
    root = logging.getLogger("sluice")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


class Agent:
    def __init__(
        self,
        conf: NetConf,
        node_name: str,
        metrics_address: str | None = None,
        kubeconfig: str | None = None,
        in_cluster: bool = False,
        resolver: str = "agent",
        verify_interval: float = 60.0,
        health_address: str | None = None,
    ) -> None:
        self.conf = conf
        self.node_name = node_name
        self.metrics_address = metrics_address
        self.health_address = health_address  # the probes apart from the metrics
        self.kubeconfig = kubeconfig
        self.from_api = bool(kubeconfig) or in_cluster  # else: the local manifest store
        # "agent": resolve every policy here; "controller": from sluicectl controller's objects.
        self.resolver = resolver
        self.verify_interval = verify_interval  # seconds; 0: no periodic verification
        self.stopped = threading.Event()

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        self.start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stopped.set())
        log.info("agent serving network %s on %s", self.conf.network, self.conf.agent_socket)
        self.stopped.wait()
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        limit_malloc_arenas()  # before any thread starts (see cni/kube/memory.py)
        conf = self.conf
        self._hold_instance_locks()  # before anything is touched: one agent per network
        if loader.load(conf.bpf_dir, settings=conf.datapath):
            log.info("compiled and pinned the datapath in %s", conf.bpf_dir)
        # The one handle on the datapath that everything in the agent works with.
        self.datapath = Datapath(conf.bpf_dir)
        self._configure_tunnel()
        self._attach_uplinks()
        self._attach_after_nat()
        self.reaper = Reaper(self.datapath)
        self.reaper.start()
        self.state = AgentState(conf.state_dir, conf.network)
        self.allocators = ipam_client.KeptAllocators()
        from cni.agent import metrics

        self.metrics = metrics.Metrics(conf, self.datapath, self.allocators)
        self.claims = prefix_claims.for_agent(conf, self.node_name, self.kubeconfig, self.from_api)
        if self.claims is not None:  # listed before the socket opens (prefix_claims.py)
            self.claims.start()
            self.metrics.registry.register(self.claims.collector())
        # Routes to the other nodes' pods: kept from the API, apart from the socket (a
        # pod on this node needs none of them to start).
        self.pod_ranges = PodRangeKeeper(self.datapath, conf.routing == "vxlan")
        self.routes = routes.for_agent(
            conf, self.node_name, self.kubeconfig, self.from_api, self._judge_uplink,
            self.pod_ranges,
        )  # fmt: skip
        if self.routes is None:
            self._own_pod_ranges()
        else:
            self.routes.start()
            self.metrics.registry.register(self.routes.collector())
        by_controller = self.resolver == "controller"
        self.enforcer = Enforcer(
            DatapathPolicyWriter(self.datapath),
            self.state,
            self.node_name,
            self.metrics.observe,
            index=ShardIndex(self.node_name) if by_controller else None,
        )
        # A set: len() is one atomic read (the index may be replaced by a rebuilt one).
        self.metrics.count_refused(lambda: len(self.enforcer.index.store.refused))
        self.metrics.name_pods(self._pods_by_ifindex)
        self._finish_cut_off_pairs()
        self.enforcer.start(self._adopt_endpoints())
        self.local_store: LocalStore | None = None
        self.api_source: KubernetesSource | None = None
        if self.from_api:
            # Ready once every collection has synced (the source marks it).
            collections = controller_collections(self.node_name) if by_controller else COLLECTIONS
            self.api_source = KubernetesSource(Api(self.kubeconfig), self.enforcer, collections)
            self.api_source.start()
        else:
            self.local_store = LocalStore(self.state, self.enforcer)
            self.local_store.load()
            self.enforcer.mark_ready()
        self.handlers = RequestHandlers(
            conf,
            self.enforcer,
            self.local_store,
            self.metrics,
            self.api_source,
            datapath=self.datapath,
            allocators=self.allocators,
        )
        from cni.agent.verify import Verifier

        self.verifier = Verifier(self.enforcer, self.verify_interval, self.metrics.count_drift)
        self.verifier.start()
        self.server = AgentServer(conf.agent_socket, self.handlers.handle, self.handlers.cni_call)
        self._serving = threading.Thread(
            target=self.server.serve_forever, name="server", daemon=True
        )
        self._serving.start()
        if self.metrics_address:
            self.metrics.serve(self.metrics_address, self._readiness)
        self.probes: Listener | None = None
        if self.health_address:
            from cni.agent import metrics_http

            self.probes = metrics_http.serve_probes(self.health_address, self._readiness)
            log.info("probes on http://%s/healthz and /readyz", self.health_address)
        log.info("agent ready in %.2f s", time.monotonic() - started)

    def _pods_by_ifindex(self) -> dict[int, tuple[str, str]]:
        """{ifindex: (namespace, pod)} of the endpoints, for the metrics; a copy made
        without the enforcer's lock (one C call under the GIL), so a scrape never
        waits for a policy batch."""
        records = list(self.enforcer.endpoints.values())
        return {r.ifindex: (r.pod_namespace, r.pod_name) for r in records}

    def _readiness(self) -> tuple[bool, str]:
        """Ready once every watched kind has synced (then policy is computed and
        enforced); else what it still waits for."""
        if self.enforcer.ready:
            return True, ""
        waiting = self.api_source.unsynced() if self.api_source else []
        return False, f"not synced yet: {', '.join(waiting) or 'starting'}"

    def _hold_instance_locks(self) -> None:
        """The network's and the socket's locks (cni/agent/instance_lock.py); raises
        AlreadyServed when another agent holds either."""
        conf = self.conf
        state = os.path.join(conf.state_dir, "agent")
        os.makedirs(state, mode=0o700, exist_ok=True)
        prepare_directory(os.path.dirname(conf.agent_socket))
        self.locks: list[InstanceLock] = []
        for path, what in (
            (os.path.join(state, f"{conf.network}.lock"), f"network {conf.network}"),
            (f"{conf.agent_socket}.lock", f"socket {conf.agent_socket}"),
        ):
            lock = InstanceLock(path)
            try:
                lock.acquire(what)
            except BaseException:
                for held in self.locks:
                    held.release()
                raise
            self.locks.append(lock)

    def stop(self) -> None:
        log.info("agent stopping")
        self.server.close()
        self.handlers.close()
        if self.api_source is not None:
            self.api_source.stop()
        self.verifier.stop()
        self.enforcer.stop()
        self.reaper.stop()
        if self.claims is not None:
            self.claims.stop()
        if self.routes is not None:
            self.routes.stop()
        self.metrics.close()
        if self.probes is not None:
            self.probes.close()
        self.state.close()
        self.allocators.close()
        self.datapath.close()
        for lock in self.locks:
            lock.release()

    def _configure_tunnel(self) -> None:
        """The tunnel's port and VNI in the datapath's config (0: native routing, no
        tunnel to guard): before any route goes through the tunnel."""
        vxlan = self.conf.routing == "vxlan"
        self.datapath.set_config(
            tunnel_port=socket.htons(self.conf.tunnel_port) if vxlan else 0,
            tunnel_vni=self.conf.tunnel_vni if vxlan else 0,
        )

    def _own_pod_ranges(self) -> None:
        """Without the API there are no other nodes: only this node's own range (and
        the cluster's) is never accepted from the network."""
        own = [self.conf.ipam.address_range] if isinstance(self.conf.ipam, NodeCIDRConfig) else []
        with KernelRouting() as routing:
            self.pod_ranges.update(routing, {}, own, self.conf.cluster_cidr, complete=True)

    def _attach_uplinks(self) -> None:
        """The program that judges service flows to backends on other nodes, on the
        interfaces towards them (idempotent; it stays attached when the agent stops)."""
        names = self.conf.uplinks
        with node_socket() as node:
            if names is None:
                default = link.default_route_interface(node)
                names = (default,) if default else ()
            for name in names:
                try:
                    uplink.attach_uplink(self.datapath, node, name)
                    log.info("judging service flows leaving through %s", name)
                except CNIError as err:
                    log.warning("no uplink program on %s: %s", name, err.details)

    def _attach_after_nat(self) -> None:
        """The program that judges service flows after DNAT, on netfilter's hooks
        (idempotent; it stays attached when the agent stops). Without it, flows to
        ClusterIPs from egress-isolated pods are refused (fail closed)."""
        try:
            after_nat.attach(self.datapath)
            log.info("judging service flows after DNAT on netfilter's FORWARD and LOCAL_IN")
        except bpf.BPFError as err:
            log.error(
                "no program judges service flows after DNAT (%s): egress-isolated pods "
                "cannot reach ClusterIPs",
                err,
            )

    def _judge_uplink(self, name: str) -> None:
        """Attach the uplink program to ``name`` (the route keeper's tunnel); raises
        CNIError when it cannot."""
        with node_socket() as node:
            uplink.attach_uplink(self.datapath, node, name)
        log.info("judging service flows leaving through %s", name)

    def _finish_cut_off_pairs(self) -> None:
        """DELs that answered but whose release an earlier agent never finished: their
        node-side veths are down. Only where policy is enforced: there only the agent
        wires pods, so a pair is up from the end of its ADD until its DEL, and a down
        one is also left only by an ADD that failed midway, which the runtime
        deletes anyway (elsewhere DEL releases before it answers)."""
        if self.conf.policy != "enforce":
            return
        with node_socket() as node:
            veths = podnet.node_veths(node, self.conf.network)
        for (container_id, ifname), veth in veths.items():
            if veth.up:
                continue
            attachment = Attachment(self.conf.network, container_id, ifname)
            try:
                delete.finish_cut_off(self.conf, attachment, self.datapath, self.allocators)
            except Exception as err:  # GC or the attachment's next ADD finishes it
                log.warning("failed to finish the DEL of %s/%s: %s", container_id, ifname, err)
            else:
                log.info("finished the DEL of %s/%s (%s was down)", container_id, ifname, veth.name)

    def _adopt_endpoints(self) -> list[EndpointRecord]:
        """The endpoints recorded before, whose veths still exist with the same ifindex."""
        adopted: list[EndpointRecord] = []
        gone: list[EndpointRecord] = []
        with node_socket() as node:
            for record in self.state.endpoints():
                from cni.spec.attachment import node_veth_name

                veth = link.get_link(
                    node, node_veth_name(self.conf.network, record.container_id, record.ifname)
                )
                (adopted if veth is not None and veth.index == record.ifindex else gone).append(
                    record
                )
        for record in gone:
            self.state.remove_endpoint(record.key)
        log.info("adopted %d endpoints, forgot %d whose veth is gone", len(adopted), len(gone))
        return adopted
