"""The node's routing in memory: the ``NodeRouting`` (``cni.net.interfaces``) that the
route keeper writes into when there is no kernel.

It keeps what a node's kernel would hold for the keeper (its routes, other
protocols' routes, the tunnel device and its peers' neighbour and FDB entries, the
neighbour entries kept resolved), which outlives a keeper as the kernel's outlives
an agent, and every write in order. It fails as the kernel can: a route refused
with PeerRouteError, the tunnel or a tunnel peer with TunnelError (``refuse_route``,
``refuse_tunnel``, ``refuse_peer``). Not thread-safe: a keeper makes its passes on
one worker, and tests call ``reconcile`` themselves.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cni.net.peer_neighbours import Neighbours
from cni.net.peer_routes import PeerRoute, PeerRouteError
from cni.net.vxlan import DEVICE, Tunnel, TunnelError

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address

UPLINK_INDEX = 2  # the interface every other node is reached through
FIRST_TUNNEL_INDEX = 10


@dataclass(frozen=True)
class Write:
    """One change the keeper made: ``what`` ("route", "remove route", "peer", "remove
    peer", "tunnel", "remove tunnel", "neighbour", "forget neighbour") and whom."""

    what: str
    target: object = None


@dataclass(frozen=True)
class KernelRoute:
    gateway: Address
    oif: int | None  # the tunnel's index for a route through it


@dataclass(frozen=True)
class TunnelDevice:
    tunnel: Tunnel
    port: int
    vni: int
    address: Address | None


@dataclass(frozen=True)
class NeighbourEntry:
    ifindex: int
    ours: bool  # of the keeper's protocol
    managed: bool


class FakeRouting:
    """Routes, the tunnel and neighbour entries in memory, as the keeper sees them."""

    def __init__(self, uplink_mtu: int | None = 1500) -> None:
        self.uplink_device_mtu = uplink_mtu  # of the interface holding the node's address
        self.routes: dict[Network, KernelRoute] = {}  # the keeper's (protocol 115)
        self.foreign: set[Network] = set()  # destinations of other protocols' routes
        self.device: TunnelDevice | None = None
        self.peer_neighbours: set[Address] = set()  # on the tunnel
        self.peer_fdb: set[Address] = set()
        self.neighbour_entries: dict[Address, NeighbourEntry] = {}
        self.writes: list[Write] = []  # every change, in order
        self.sessions = 0  # how many times the keeper opened it (once a pass)
        self.open_now = False
        self._next_index = FIRST_TUNNEL_INDEX
        self._refusals: dict[tuple[str, object], int] = {}

    @contextmanager
    def open(self) -> Iterator[FakeRouting]:
        """The keeper's factory: one session per pass, as one socket is on a node."""
        assert not self.open_now, "a pass opened the routing while one was open"
        self.sessions += 1
        self.open_now = True
        try:
            yield self
        finally:
            self.open_now = False

    # -- failures to come ----------------------------------------------------------------

    def refuse_route(self, dst: Network, times: int = 1) -> None:
        """Make the next ``times`` writes or removals of the route to ``dst`` fail."""
        self._refusals[("route", dst)] = times

    def refuse_peer(self, node: Address, times: int = 1) -> None:
        """Make the next ``times`` writes or removals of the tunnel peer ``node`` fail."""
        self._refusals[("peer", node)] = times

    def refuse_tunnel(self, times: int = 1) -> None:
        """Make the next ``times`` set-ups of the tunnel fail."""
        self._refusals[("tunnel", None)] = times

    # -- reading it ----------------------------------------------------------------------

    @property
    def tunnel_index(self) -> int | None:
        return self.device.tunnel.index if self.device is not None else None

    def route_to(self, dst: str) -> PeerRoute | None:
        """The keeper's route to ``dst`` as ``kept_routes`` reports it."""
        return self.kept_routes(self.tunnel_index).get(Network(dst))

    def writes_of(self, *what: str) -> list[Write]:
        return [w for w in self.writes if w.what in what]

    # -- NeighbourTable ------------------------------------------------------------------

    def neighbours(self) -> Neighbours:
        entries = self.neighbour_entries.items()
        return Neighbours(
            {node: e.ifindex for node, e in entries if e.ours},
            {node for node, e in entries if e.managed},
        )

    def keep_resolved(self, node: Address) -> None:
        self.neighbour_entries[node] = NeighbourEntry(UPLINK_INDEX, ours=True, managed=True)
        self.writes.append(Write("neighbour", node))

    def forget_neighbour(self, node: Address, ifindex: int) -> None:
        entry = self.neighbour_entries.get(node)
        if entry is not None and entry.ifindex == ifindex:
            del self.neighbour_entries[node]
        self.writes.append(Write("forget neighbour", node))

    # -- the tunnel ----------------------------------------------------------------------

    def uplink_mtu(self, local: Address) -> int | None:
        return self.uplink_device_mtu

    def ensure_tunnel(
        self, local: Address, mtu: int, port: int, vni: int, address: Address | None
    ) -> Tunnel:
        if self._refused("tunnel", None):
            raise TunnelError(f"failed to set up {DEVICE} (local {local}): refused")
        device = self.device
        if device is not None and (device.tunnel.local, device.port, device.vni) != (
            local,
            port,
            vni,
        ):
            self._drop_device()  # recreated, as vxlan.ensure does
            device = None
        index = device.tunnel.index if device is not None else self._new_index()
        self.device = TunnelDevice(Tunnel(index, local, mtu), port, vni, address)
        self.writes.append(Write("tunnel", self.device))
        return self.device.tunnel

    def remove_tunnel(self) -> bool:
        if self.device is None:
            return False
        self._drop_device()
        self.writes.append(Write("remove tunnel"))
        return True

    def tunnel_peers(self, index: int) -> tuple[set[Address], set[Address]]:
        assert index == self.tunnel_index, "the peers of a device that is not there"
        return self.peer_neighbours & self.peer_fdb, self.peer_neighbours | self.peer_fdb

    def write_peer(self, index: int, node: Address) -> None:
        if self._refused("peer", node) or index != self.tunnel_index:
            raise TunnelError(f"failed to write the tunnel peer {node}: refused")
        self.peer_neighbours.add(node)
        self.peer_fdb.add(node)
        self.writes.append(Write("peer", node))

    def remove_peer(self, index: int, node: Address) -> None:
        if self._refused("peer", node):
            raise TunnelError(f"failed to remove the tunnel peer {node}: refused")
        self.peer_neighbours.discard(node)
        self.peer_fdb.discard(node)
        self.writes.append(Write("remove peer", node))

    # -- the routes ----------------------------------------------------------------------

    def kept_routes(self, tunnel_index: int | None) -> dict[Network, PeerRoute]:
        return {
            dst: PeerRoute(dst, r.gateway, tunnel_index is not None and r.oif == tunnel_index)
            for dst, r in self.routes.items()
        }

    def foreign_destinations(self) -> set[Network]:
        return set(self.foreign)

    def write_route(self, route: PeerRoute, tunnel_index: int | None) -> None:
        if route.tunnel and tunnel_index is None:
            raise PeerRouteError(f"no tunnel device for the route to {route.dst}")
        if self._refused("route", route.dst):
            raise PeerRouteError(f"failed to write the route to {route.dst}: refused")
        self.foreign.discard(route.dst)  # a replace takes whatever route's place
        self.routes[route.dst] = KernelRoute(route.gateway, tunnel_index if route.tunnel else None)
        self.writes.append(Write("route", route))

    def remove_route(self, dst: Network) -> None:
        if self._refused("route", dst):
            raise PeerRouteError(f"failed to remove the route to {dst}: refused")
        self.routes.pop(dst, None)
        self.writes.append(Write("remove route", dst))

    # -- internals -----------------------------------------------------------------------

    def _refused(self, kind: str, target: object) -> bool:
        left = self._refusals.get((kind, target), 0)
        if left:
            self._refusals[(kind, target)] = left - 1
        return left > 0

    def _new_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def _drop_device(self) -> None:
        """The device gone, and with it its peers and the routes through it."""
        index = self.tunnel_index
        self.device = None
        self.peer_neighbours.clear()
        self.peer_fdb.clear()
        self.routes = {dst: r for dst, r in self.routes.items() if r.oif != index}
