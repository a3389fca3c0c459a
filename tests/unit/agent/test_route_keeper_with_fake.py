"""The route keeper against the node's routing in memory: what a partial view may
change, what waits for the full one, the tunnel and its peers, routes of others, and
writes the kernel refuses.

The keeper is the agent's own, given its view by hand (``replace`` and ``change``,
as its informers would call them, which are never started; ``listed`` marks every
collection as listed in full); the kernel is
``tests.harness.fake_routes.FakeRouting``, which fails on demand as the kernel can.
"""

from __future__ import annotations

import logging
import threading
from ipaddress import IPv4Address as A
from ipaddress import IPv4Network as N
from types import SimpleNamespace
from typing import Any

import pytest

from cni.agent.pod_ranges import PodRangeKeeper
from cni.agent.routes import DEFAULT_UPLINK_MTU, RouteKeeper
from cni.kube.nodes import NodeAddressing
from cni.net.peer_routes import PeerRoute
from cni.net.vxlan import DEVICE
from cni.plugin.netconf import parse
from cni.spec.errors import ERR_UNSUPPORTED_FIELD, CNIError
from tests.harness.fake_routes import UPLINK_INDEX, FakeRouting, NeighbourEntry, Write

ME = NodeAddressing("n1", (N("10.244.1.0/24"),), A("192.168.5.1"))
TWO = NodeAddressing("n2", (N("10.244.2.0/24"),), A("192.168.5.2"))
THREE = NodeAddressing("n3", (N("10.244.3.0/24"),), A("192.168.5.3"))
GONE = N("10.244.9.0/24")  # a range the keeper routed before a restart
CONF: dict[str, Any] = {
    "cniVersion": "1.1.0",
    "name": "net1",
    "type": "sluice",
    "ipam": {"type": "sluice-ipam", "subnet": "10.244.1.0/24"},
    "clusterCIDR": "10.244.0.0/16",
}


class NoApi:
    """The keeper's informers are never started: nothing reads the API."""

    def close(self) -> None:
        pass


def keeper(
    fake: FakeRouting,
    routing: str = "native",
    judge_uplink: Any = None,
    pod_ranges: PodRangeKeeper | None = None,
) -> RouteKeeper:
    conf = parse({**CONF, "routing": routing})
    return RouteKeeper(conf, "n1", NoApi(), judge_uplink, pod_ranges, routing=fake.open)  # type: ignore[arg-type]


def listed(keeper: RouteKeeper) -> None:
    """Every watched collection listed in full, as the informers would report it."""
    for informer in keeper.informers:
        informer.synced.set()


def route(dst: NodeAddressing, tunnel: bool = False) -> PeerRoute:
    assert dst.internal_ip is not None
    return PeerRoute(dst.pod_cidrs[0], dst.internal_ip, tunnel)


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


# -- the view ------------------------------------------------------------------------------


def test_a_partial_view_adds_routes_and_removes_none() -> None:
    fake = FakeRouting()
    fake.write_route(PeerRoute(GONE, A("192.168.5.9")), None)  # left by the last agent
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO])
    steps = routes.reconcile()
    assert steps.remove == () and steps.write == (route(TWO),)
    assert set(fake.routes) == {GONE, TWO.pod_cidrs[0]}
    assert not routes.reconciled.is_set()  # not until the view is complete
    assert fake.sessions == 1 and not fake.open_now


def test_routes_go_once_every_collection_is_listed() -> None:
    fake = FakeRouting()
    fake.write_route(PeerRoute(GONE, A("192.168.5.9")), None)
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO, THREE])
    routes.reconcile()
    listed(routes)
    routes.reconcile()
    assert set(fake.routes) == {TWO.pod_cidrs[0], THREE.pod_cidrs[0]}
    assert routes.reconciled.is_set() and routes.kept == 2
    routes.change("nodes", "DELETED", THREE)
    steps = routes.reconcile()
    assert steps.remove == (THREE.pod_cidrs[0],)
    assert fake.route_to("10.244.2.0/24") == route(TWO)
    assert fake.route_to("10.244.3.0/24") is None


def test_a_node_that_changes_address_has_its_route_replaced() -> None:
    fake = FakeRouting()
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    moved = TWO._replace(internal_ip=A("192.168.5.22"))
    routes.change("nodes", "MODIFIED", moved)
    assert routes.reconcile().write == (route(moved),)
    assert fake.route_to("10.244.2.0/24") == route(moved)
    assert routes.reconcile().write == ()  # in place: nothing more to do


# -- routes of others, refused writes --------------------------------------------------------


def test_a_route_of_another_protocol_blocks_ours(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeRouting()
    fake.foreign.add(TWO.pod_cidrs[0])
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO, THREE])
    listed(routes)
    for _ in range(2):
        steps = routes.reconcile()
        assert steps.blocked == (TWO.pod_cidrs[0],)
    assert fake.foreign == {TWO.pod_cidrs[0]}  # never replaced
    assert set(fake.routes) == {THREE.pod_cidrs[0]}
    assert routes.kept == 1 and routes.problems == 1
    assert len(warnings(caplog, "a route of another protocol")) == 1


def test_a_refused_write_is_reported_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeRouting()
    fake.refuse_route(TWO.pod_cidrs[0], times=2)
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO, THREE])
    listed(routes)
    routes.reconcile()
    routes.reconcile()
    assert set(fake.routes) == {THREE.pod_cidrs[0]}  # the others are written meanwhile
    assert routes.problems == 1
    assert len(warnings(caplog, "failed to write the route to 10.244.2.0/24")) == 1
    routes.reconcile()
    assert fake.route_to("10.244.2.0/24") == route(TWO)
    assert routes.problems == 0


def test_a_refused_removal_is_retried() -> None:
    fake = FakeRouting()
    fake.write_route(PeerRoute(GONE, A("192.168.5.9")), None)
    fake.refuse_route(GONE)
    routes = keeper(fake)
    routes.replace("nodes", [ME])
    listed(routes)
    assert routes.reconcile().remove == (GONE,)
    assert GONE in fake.routes and routes.problems == 1
    routes.reconcile()
    assert fake.routes == {} and routes.problems == 0


# -- the tunnel ----------------------------------------------------------------------------


def test_no_routes_while_the_tunnel_is_missing() -> None:
    fake = FakeRouting()
    fake.write_route(PeerRoute(GONE, A("192.168.5.9")), None)
    routes = keeper(fake, "vxlan")
    routes.replace("nodes", [ME._replace(internal_ip=None), TWO])  # no address: no tunnel
    listed(routes)
    steps = routes.reconcile()
    assert fake.device is None and steps.write == steps.remove == ()
    assert set(fake.routes) == {GONE}  # nor is anything taken away meanwhile
    assert not routes.reconciled.is_set() and routes.kept == 0
    assert routes.problems == 1  # the tunnel
    routes.change("nodes", "MODIFIED", ME)
    routes.reconcile()
    assert fake.device is not None and routes.reconciled.is_set()
    assert fake.route_to("10.244.2.0/24") == route(TWO, tunnel=True)
    assert GONE not in fake.routes and routes.problems == 0


def test_the_tunnel_as_the_node_needs_it() -> None:
    fake = FakeRouting(uplink_mtu=9000)
    judged: list[str] = []
    routes = keeper(fake, "vxlan", judge_uplink=judged.append)
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    routes.reconcile()
    assert fake.device is not None
    tunnel = fake.device.tunnel
    assert (tunnel.local, tunnel.mtu) == (ME.internal_ip, 9000 - 50)
    assert (fake.device.port, fake.device.vni) == (4789, 7346)
    assert fake.device.address == A("10.244.1.0")  # the pod range's network address
    assert judged == [DEVICE]  # once per device, before any route through it
    fake.uplink_device_mtu = None
    routes.reconcile()
    assert fake.device.tunnel.mtu == DEFAULT_UPLINK_MTU - 50


def test_a_tunnel_the_kernel_refuses_carries_no_routes_until_it_is_there() -> None:
    fake = FakeRouting()
    fake.refuse_tunnel()
    routes = keeper(fake, "vxlan")
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    assert fake.routes == {} and routes.problems == 1
    routes.reconcile()
    assert fake.route_to("10.244.2.0/24") == route(TWO, tunnel=True)
    assert routes.problems == 0


def test_a_tunnel_that_cannot_be_judged_carries_no_routes() -> None:
    fake = FakeRouting()

    def refuse(name: str) -> None:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f"no program on {name}")

    routes = keeper(fake, "vxlan", judge_uplink=refuse)
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    assert fake.device is not None  # there, but nothing goes through it
    assert fake.routes == {} and fake.peer_fdb == set() and routes.problems == 1


def test_tunnel_peers_come_before_their_routes_and_go_after_them() -> None:
    fake = FakeRouting()
    routes = keeper(fake, "vxlan")
    routes.replace("nodes", [ME, TWO, THREE])
    listed(routes)
    routes.reconcile()
    assert fake.peer_neighbours == fake.peer_fdb == {TWO.internal_ip, THREE.internal_ip}
    made = fake.writes_of("peer", "route")
    assert [w.what for w in made] == ["peer", "peer", "route", "route"]
    routes.change("nodes", "DELETED", THREE)
    routes.reconcile()
    assert fake.peer_neighbours == fake.peer_fdb == {TWO.internal_ip}
    assert fake.writes[-2:] == [
        Write("remove route", THREE.pod_cidrs[0]),
        Write("remove peer", THREE.internal_ip),
    ]


def test_half_written_peers_are_completed_or_removed() -> None:
    fake = FakeRouting()
    routes = keeper(fake, "vxlan")
    routes.replace("nodes", [ME, TWO])
    routes.reconcile()  # the device, and a partial view
    stale = A("192.168.5.9")
    fake.peer_fdb |= {TWO.internal_ip, stale}  # no neighbour entries: half of each
    routes.reconcile()
    assert fake.peer_neighbours == {TWO.internal_ip}  # completed
    assert stale in fake.peer_fdb  # kept until the view is complete
    listed(routes)
    routes.reconcile()
    assert fake.peer_fdb == {TWO.internal_ip}


def test_a_refused_peer_is_reported_and_written_at_the_next_pass() -> None:
    fake = FakeRouting()
    fake.refuse_peer(A("192.168.5.2"))
    routes = keeper(fake, "vxlan")
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    assert fake.peer_fdb == set() and routes.problems == 1
    routes.reconcile()
    assert fake.peer_fdb == {TWO.internal_ip} and routes.problems == 0


def test_native_routing_removes_the_tunnel_an_earlier_one_left() -> None:
    fake = FakeRouting()
    fake.ensure_tunnel(A("192.168.5.1"), 1450, 4789, 7346, None)
    fake.write_route(route(TWO, tunnel=True), fake.tunnel_index)
    routes = keeper(fake)
    routes.replace("nodes", [ME, TWO])
    listed(routes)
    routes.reconcile()
    assert fake.device is None and fake.writes_of("remove tunnel")
    assert fake.route_to("10.244.2.0/24") == route(TWO)  # now via the node network


# -- the uplinks' view -------------------------------------------------------------------


class Network:
    """The datapath's pod_ranges and tunnel_peers maps, in memory."""

    def __init__(self) -> None:
        self.ranges: dict[N, Any] = {}
        self.peers: set[str] = set()

    def pod_ranges(self) -> dict[N, Any]:
        return dict(self.ranges)

    def set_pod_ranges(self, ranges: dict[N, Any]) -> None:
        self.ranges = dict(ranges)

    def tunnel_peers(self) -> set[str]:
        return set(self.peers)

    def set_tunnel_peers(self, peers: Any) -> None:
        self.peers = set(peers)


def test_the_pod_range_keeper_follows_the_routes_and_keeps_peers_resolved() -> None:
    fake = FakeRouting()
    stale = A("192.168.5.9")
    fake.neighbour_entries[stale] = NeighbourEntry(UPLINK_INDEX, ours=True, managed=True)
    datapath = SimpleNamespace(lock=threading.Lock(), network=Network())
    ranges = PodRangeKeeper(datapath, tunnel=True)  # type: ignore[arg-type]
    routes = keeper(fake, "vxlan", pod_ranges=ranges)
    routes.replace("nodes", [ME, TWO])
    routes.reconcile()
    assert datapath.network.peers == {"192.168.5.2"}
    assert set(datapath.network.ranges) == {
        N("10.244.2.0/24"),
        N("10.244.1.0/24"),
        N("10.244.0.0/16"),
    }
    assert set(fake.neighbours().managed) == {TWO.internal_ip, stale}  # stale kept meanwhile
    listed(routes)
    routes.reconcile()
    assert fake.neighbours().ours == {TWO.internal_ip: UPLINK_INDEX}
    assert len(fake.writes_of("neighbour")) == 1  # a managed entry is left alone
