"""The node's ``NodeRouting`` (``cni.net.interfaces``): the kernel, through pyroute2."""

from __future__ import annotations

import ipaddress
from types import TracebackType

from pyroute2 import IPRoute

from cni.net import peer_neighbours, peer_routes, vxlan
from cni.net.peer_neighbours import Neighbours
from cni.net.peer_routes import PeerRoute
from cni.net.vxlan import Tunnel

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address


class KernelRouting:
    """The routing of the node's network namespace over one rtnetlink socket, opened
    with the object and closed when its ``with`` block ends: one per pass."""

    def __init__(self) -> None:
        self.ipr = IPRoute()

    def __enter__(self) -> KernelRouting:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.ipr.close()

    # -- NeighbourTable ------------------------------------------------------------------

    def neighbours(self) -> Neighbours:
        return peer_neighbours.neighbours(self.ipr)

    def keep_resolved(self, node: Address) -> None:
        peer_neighbours.keep_resolved(self.ipr, node)

    def forget_neighbour(self, node: Address, ifindex: int) -> None:
        peer_neighbours.forget(self.ipr, node, ifindex)

    # -- the tunnel ----------------------------------------------------------------------

    def uplink_mtu(self, local: Address) -> int | None:
        return vxlan.uplink_mtu(self.ipr, local)

    def ensure_tunnel(
        self, local: Address, mtu: int, port: int, vni: int, address: Address | None
    ) -> Tunnel:
        return vxlan.ensure(self.ipr, local, mtu, port, vni, address)

    def remove_tunnel(self) -> bool:
        return vxlan.remove_device(self.ipr)

    def tunnel_peers(self, index: int) -> tuple[set[Address], set[Address]]:
        return vxlan.peers(self.ipr, index)

    def write_peer(self, index: int, node: Address) -> None:
        vxlan.write_peer(self.ipr, index, node)

    def remove_peer(self, index: int, node: Address) -> None:
        vxlan.remove_peer(self.ipr, index, node)

    # -- the routes ----------------------------------------------------------------------

    def kept_routes(self, tunnel_index: int | None) -> dict[Network, PeerRoute]:
        return peer_routes.kept_routes(self.ipr, tunnel_index)

    def foreign_destinations(self) -> set[Network]:
        return peer_routes.foreign_destinations(self.ipr)

    def write_route(self, route: PeerRoute, tunnel_index: int | None) -> None:
        peer_routes.write(self.ipr, route, tunnel_index)

    def remove_route(self, dst: Network) -> None:
        peer_routes.remove(self.ipr, dst)
