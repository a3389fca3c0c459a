"""The route keeper: routes to the pods of the other nodes, kept from the API.

With the API (``--kubeconfig``, or in a pod), the agent lists and watches Nodes
(each cut to its name, IPv4 podCIDRs and InternalIP, cni/kube/nodes.py) and, in
prefix mode with the claims in the API, the pool's PrefixClaims. It keeps one
route per remote pod range (a node's podCIDR, or each prefix another node holds)
via that node's InternalIP, marked with its own protocol number
(cni/net/peer_routes.py) so that it finds its own after a restart and never
touches anybody else's. With ``"routing": "vxlan"`` the routes go through the
tunnel device, each node a static peer (cni/net/vxlan.py). It reaches the kernel
only through ``NodeRouting`` (cni/net/interfaces.py), opened once per pass.

Additions and changes are made as soon as they are seen. Removals wait until
every watched collection has been listed in full (cni/agent/route_plan.py): a
restarted agent keeps the routes it finds until the list of Nodes is in, and a
Node's deletion removes its routes from then on. Everything is checked again
every ``RESYNC_SECONDS``, which also repairs a route somebody deleted.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cni.agent import route_plan
from cni.agent.pod_ranges import PodRangeKeeper
from cni.agent.prefix_claims import uses_api_claims
from cni.kube import nodes, prefixclaims
from cni.kube.api import Api
from cni.kube.informer import Informer
from cni.kube.nodes import NodeAddressing
from cni.net import vxlan
from cni.net.interfaces import NodeRouting
from cni.net.kernel_routing import KernelRouting
from cni.net.peer_routes import PeerRoute, PeerRouteError
from cni.net.vxlan import TunnelError
from cni.plugin.netconf import NetConf
from cni.spec.errors import CNIError
from cni.work.queue import Worker, WorkQueue
from ipam.claims import PoolBlocks
from ipam.config import NodeCIDRConfig, PrefixConfig

log = logging.getLogger("sluice.routes")

RESYNC_SECONDS = 30.0
PASS = "routes"  # the work queue's one key
DEFAULT_UPLINK_MTU = 1500


def for_agent(
    conf: NetConf,
    node_name: str,
    kubeconfig: str | None,
    from_api: bool,
    judge_uplink: Callable[[str], None],
    pod_ranges: PodRangeKeeper | None = None,
) -> RouteKeeper | None:
    """The network's route keeper when the agent reads the API, else None (a single
    host has no other nodes). ``judge_uplink(name)`` attaches the programs that judge
    service flows leaving through an interface and what arrives through it; the
    tunnel gets them before any route goes through it. ``pod_ranges`` is told who
    holds which range after every pass."""
    if not from_api:
        return None
    return RouteKeeper(conf, node_name, Api(kubeconfig), judge_uplink, pod_ranges)


def _parse_claim(obj: dict[str, Any]) -> route_plan.Claimed | None:
    try:
        claim = prefixclaims.parse(obj)
    except prefixclaims.ClaimFormatError as err:
        log.warning("ignoring a PrefixClaim: %s", err)
        return None
    return route_plan.Claimed(claim.block, claim.node, claim.pool)


class RouteKeeper:
    def __init__(
        self,
        conf: NetConf,
        node_name: str,
        api: Api,
        judge_uplink: Callable[[str], None] | None = None,
        pod_ranges: PodRangeKeeper | None = None,
        *,
        routing: Callable[[], AbstractContextManager[NodeRouting]] = KernelRouting,
    ) -> None:
        self.conf = conf
        # The uplinks' view of who holds which range (cni/agent/pod_ranges.py).
        self.pod_ranges = pod_ranges
        self.node_name = node_name
        self.api = api
        self.tunnel = conf.routing == "vxlan"
        self.judge_uplink = judge_uplink
        # The node's routing, opened once per pass (cni/net/interfaces.py).
        self.routing = routing
        self._judged_tunnel: int | None = None  # the tunnel's ifindex once judged
        self.nodes: dict[str, NodeAddressing] = {}
        # prefix mode with the claims in the API: prefix -> holder; else None
        self.claims: dict[ipaddress.IPv4Network, route_plan.Claimed] | None = None
        self.blocks: PoolBlocks | None = None  # what each of those claims must be
        self.informers = [Informer(api, "nodes", nodes.PATH, nodes.parse_node, self)]
        if uses_api_claims(conf.ipam):
            assert isinstance(conf.ipam, PrefixConfig)
            self.claims = {}
            self.blocks = PoolBlocks(conf.ipam.pool, conf.ipam.prefix_length)
            selector = f"{prefixclaims.POOL_LABEL}={prefixclaims.label_of(conf.ipam.pool)}"
            self.informers.append(
                Informer(
                    api,
                    "prefixclaims",
                    prefixclaims.PATH,
                    _parse_claim,
                    self,
                    {"labelSelector": selector},
                )
            )
        self.reconciled = threading.Event()  # set after each pass that had the full view
        self.kept = 0  # routes the last pass left in place
        self._lock = threading.Lock()
        self._errors: dict[str, str] = {}  # what failed last, so it is logged once
        self._said_partial = False
        # One key: a pass reads the whole view, so changes meanwhile make one more pass.
        self._queue: WorkQueue[str] = WorkQueue()
        self._worker = Worker("route-keeper", self._queue, self._pass, log)

    def start(self) -> None:
        log.info(
            "keeping routes to the other nodes' pods (%s) for node %s",
            self.conf.routing,
            self.node_name,
        )
        for informer in self.informers:
            informer.start()
        self._queue.add(PASS)  # a first pass at once: the tunnel, and routes to re-add
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        for informer in self.informers:
            informer.stop()
        self.api.close()

    @property
    def complete(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    # -- the informers' sink ------------------------------------------------------------

    def replace(self, kind: str, objects: list[Any]) -> None:
        with self._lock:
            if kind == "nodes":
                self.nodes = {n.name: n for n in objects}
            elif self.claims is not None:
                self.claims = {c.prefix: c for c in objects}
        self._queue.add(PASS)

    def change(self, kind: str, event: str, obj: Any) -> None:
        with self._lock:
            table: dict[Any, Any] = self.nodes
            if kind != "nodes":
                if self.claims is None:
                    return
                table = self.claims
            key = obj.name if kind == "nodes" else obj.prefix
            if event == "DELETED":
                changed = table.pop(key, None) is not None
            else:
                changed = table.get(key) != obj
                table[key] = obj
        if changed:  # a Node's heartbeat changes nothing here
            self._queue.add(PASS)

    # -- reconciling ---------------------------------------------------------------------

    def _pass(self, _key: str) -> float:
        self.reconcile()  # an exception is a bug: the worker logs it and tries again
        return RESYNC_SECONDS

    def _own_ranges(self) -> list[ipaddress.IPv4Network]:
        ipam = self.conf.ipam
        return [ipam.address_range] if isinstance(ipam, NodeCIDRConfig) else []

    def reconcile(self) -> route_plan.RoutePlan:
        """One pass: the routes (and tunnel peers) the view asks for, made so."""
        with self._lock:
            complete = self.complete
            known = list(self.nodes.values())
            claims = list(self.claims.values()) if self.claims is not None else None
        if not complete and not self._said_partial:
            log.info("not every collection is listed yet: routes are added, none removed")
            self._said_partial = True
        desired = route_plan.desired_routes(
            known, self.node_name, self._own_ranges(), self.tunnel, claims, self.blocks
        )
        self._report_left_out(desired)
        with self.routing() as routing:
            own = next((n for n in known if n.name == self.node_name), None)
            tunnel_index = self._tunnel(routing, own)
            routes = desired.routes
            if self.tunnel and tunnel_index is None:
                routes = {}  # nothing can go through a tunnel that is not there yet
                complete = False  # and nothing is taken away because of it
            steps = self._make_routes(routing, routes, tunnel_index, complete)
            if self.pod_ranges is not None:
                held = {dst: route.gateway for dst, route in routes.items()}
                cluster = self.conf.cluster_cidr
                self.pod_ranges.update(routing, held, desired.own, cluster, complete)
        self.kept = len(routes) - len(steps.blocked)
        if complete:
            self.reconciled.set()
        return steps

    def _make_routes(
        self,
        routing: NodeRouting,
        routes: dict[ipaddress.IPv4Network, PeerRoute],
        tunnel_index: int | None,
        complete: bool,
    ) -> route_plan.RoutePlan:
        """The routes (and their tunnel peers) made as ``routes`` says: a peer is written
        before the routes through it and removed after them."""
        present = routing.kept_routes(tunnel_index)
        foreign = routing.foreign_destinations()
        steps = route_plan.plan(routes, present, foreign, complete)
        peers = route_plan.PeerPlan((), ())
        if tunnel_index is not None:
            whole, partial = routing.tunnel_peers(tunnel_index)
            peers = route_plan.plan_peers(routes, whole, partial, complete)
            for node_ip in peers.write:
                self._try(f"peer {node_ip}", routing.write_peer, tunnel_index, node_ip)
        for route in steps.write:
            if self._try(f"route {route.dst}", routing.write_route, route, tunnel_index):
                log.info("route to %s via %s%s", route.dst, route.gateway, self._how)
        for dst in steps.remove:
            if self._try(f"route {dst}", routing.remove_route, dst):
                log.info("removed the route to %s (%s)", dst, present[dst].gateway)
        if tunnel_index is not None:
            for node_ip in peers.remove:
                self._try(f"peer {node_ip}", routing.remove_peer, tunnel_index, node_ip)
        for dst in steps.blocked:
            self._report(
                f"blocked {dst}",
                f"not routing {dst}: a route of another protocol to it is there",
            )
        return steps

    def _report_left_out(self, desired: route_plan.Desired) -> None:
        """The ranges the view names but no route is made for, and the routed ranges
        whose traffic is masqueraded."""
        skips = {f"skip {dst}": f"no route to {dst}: {why}" for dst, why in desired.skipped.items()}
        for what in [w for w in self._errors if w.startswith("skip ") and w not in skips]:
            del self._errors[what]  # its Node or claim is gone or mended: no longer a problem
        for what, message in skips.items():
            self._report(what, message)
        cluster = self.conf.cluster_cidr
        if self.conf.ip_masq and cluster is not None:
            for dst in desired.routes:
                if not dst.subnet_of(cluster):
                    self._report(
                        f"masq {dst}",
                        f"pod traffic to {dst} is masqueraded: it is outside clusterCIDR "
                        f"{cluster} (set clusterCIDR to the cluster's pod range)",
                    )

    @property
    def _how(self) -> str:
        return f" through {vxlan.DEVICE}" if self.tunnel else ""

    def _tunnel(self, routing: NodeRouting, own: NodeAddressing | None) -> int | None:
        """The tunnel device's index once this node's address is known (vxlan), else
        None, the device removed if an earlier configuration left one (native)."""
        if not self.tunnel:
            if routing.remove_tunnel():
                log.info("removed %s: routing is %s", vxlan.DEVICE, self.conf.routing)
            return None
        if own is None or own.internal_ip is None:
            self._report("tunnel", f"no tunnel yet: node {self.node_name} has no InternalIP")
            return None
        mtu = (routing.uplink_mtu(own.internal_ip) or DEFAULT_UPLINK_MTU) - (
            self.conf.encapsulation_overhead
        )
        own_range = self._own_ranges()[0] if self._own_ranges() else None
        try:
            tunnel = routing.ensure_tunnel(
                own.internal_ip,
                mtu,
                self.conf.tunnel_port,
                self.conf.tunnel_vni,
                vxlan.tunnel_address(own_range),
            )
        except TunnelError as err:
            self._report("tunnel", str(err))
            return None
        # Egress through a Service to a backend on another node is judged where the
        # flow leaves the node (after kube-proxy's DNAT): with a tunnel, that is the
        # tunnel. Until its program is attached, nothing is routed through it, so no
        # such flow leaves unjudged (fail closed).
        if self.judge_uplink is not None and self._judged_tunnel != tunnel.index:
            try:
                self.judge_uplink(vxlan.DEVICE)
            except CNIError as err:
                self._report("tunnel", f"no routes through {vxlan.DEVICE}: {err.details}")
                return None
            self._judged_tunnel = tunnel.index
        self._errors.pop("tunnel", None)
        return tunnel.index

    def _try(self, what: str, operation: Any, *args: Any) -> bool:
        try:
            operation(*args)
        except (PeerRouteError, TunnelError) as err:
            self._report(what, str(err))
            return False
        self._errors.pop(what, None)
        return True

    @property
    def problems(self) -> int:
        """What failed or was left out at the last attempt, and is not fixed yet."""
        return len(self._errors)

    def collector(self) -> Collector:
        return _RouteMetrics(self)

    def _report(self, what: str, message: str) -> None:
        if self._errors.get(what) != message:
            log.warning("%s", message)
            self._errors[what] = message


class _RouteMetrics(Collector):
    def __init__(self, keeper: RouteKeeper) -> None:
        self.keeper = keeper

    def collect(self) -> Any:
        labels = ["network", "routing"]
        values = [self.keeper.conf.network, self.keeper.conf.routing]
        kept = GaugeMetricFamily(
            "sluice_node_routes",
            "Routes to other nodes' pod ranges the route keeper holds (proto 115).",
            labels=labels,
        )
        kept.add_metric(values, self.keeper.kept)
        yield kept
        problems = GaugeMetricFamily(
            "sluice_node_route_problems",
            "Ranges the route keeper leaves out (a PrefixClaim that is no block of the pool, "
            "overlapping ranges, an InternalIP that is a pod address) or tunnel parts it "
            "could not set up as wanted (logged).",
            labels=labels,
        )
        problems.add_metric(values, self.keeper.problems)
        yield problems
