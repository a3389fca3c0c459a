"""What the agent's route keeper needs of the node's routing, as Protocols.

The route keeper (``cni.agent.routes``) decides which routes to other nodes' pod
ranges, which tunnel and which tunnel peers the node must have; the kernel holds
them. Between the two is ``NodeRouting``: the keeper opens one for each pass and
calls nothing else of the kernel. Of it, the pod-range keeper
(``cni.agent.pod_ranges``) needs only the ``NeighbourTable``. On a node it is
``cni.net.kernel_routing.KernelRouting`` (one rtnetlink socket per pass, over
``peer_routes``, ``vxlan`` and ``peer_neighbours``); in tests it is an in-memory
table that records what it was given and can fail a write as the kernel can, so
the keeper's logic is tested without root.

A write the kernel refuses raises the error of its part, whose message names what
was refused: ``TunnelError`` (the tunnel, a tunnel peer), ``PeerRouteError`` (a
route), ``NeighbourError`` (a neighbour entry). The route keeper reports it and
tries again at its next pass; the pod-range keeper logs it. A read the kernel
refuses raises what the socket raised: to the keeper that is a bug, which its
worker logs before the next pass.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from cni.net.peer_neighbours import Neighbours
from cni.net.peer_routes import PeerRoute
from cni.net.vxlan import Tunnel

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address


class NeighbourTable(Protocol):
    """The other nodes' entries in the node's neighbour table."""

    def neighbours(self) -> Neighbours:
        """The route keeper's entries (by address, with their interface) and the
        managed ones."""
        ...

    def keep_resolved(self, node: Address) -> None:
        """A managed entry for ``node`` on the interface the node reaches it through
        (NeighbourError)."""
        ...

    def forget_neighbour(self, node: Address, ifindex: int) -> None:
        """Delete the entry of ``node`` on ``ifindex`` (NeighbourError)."""
        ...


class NodeRouting(NeighbourTable, Protocol):
    """The tunnel, its peers and the route keeper's routes (protocol 115)."""

    # -- the tunnel ---------------------------------------------------------------------

    def uplink_mtu(self, local: Address) -> int | None:
        """The MTU of the interface that holds the node's address ``local``."""
        ...

    def ensure_tunnel(
        self, local: Address, mtu: int, port: int, vni: int, address: Address | None
    ) -> Tunnel:
        """The tunnel device as ``vxlan.ensure`` makes it: recreated when its local
        address, port or VNI differ; its MTU, MAC and one ``address`` set; up
        (TunnelError)."""
        ...

    def remove_tunnel(self) -> bool:
        """Delete the tunnel device; whether there was one (TunnelError)."""
        ...

    def tunnel_peers(self, index: int) -> tuple[set[Address], set[Address]]:
        """Node addresses on the tunnel ``index``: (with both their neighbour and FDB
        entries, with either)."""
        ...

    def write_peer(self, index: int, node: Address) -> None:
        """Both of ``node``'s entries on the tunnel (TunnelError)."""
        ...

    def remove_peer(self, index: int, node: Address) -> None:
        """Both of ``node``'s entries on the tunnel; absent ones are fine (TunnelError)."""
        ...

    # -- the routes ---------------------------------------------------------------------

    def kept_routes(self, tunnel_index: int | None) -> dict[Network, PeerRoute]:
        """The keeper's routes, by destination; those through ``tunnel_index`` are
        tunnel routes."""
        ...

    def foreign_destinations(self) -> set[Network]:
        """Destinations of routes of any other protocol, which the keeper must not
        replace."""
        ...

    def write_route(self, route: PeerRoute, tunnel_index: int | None) -> None:
        """Add or replace the keeper's route (PeerRouteError)."""
        ...

    def remove_route(self, dst: Network) -> None:
        """Delete the keeper's route to ``dst``; absent is fine (PeerRouteError)."""
        ...
