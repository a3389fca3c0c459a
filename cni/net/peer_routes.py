"""Routes to other nodes' pod ranges, as the route keeper writes them (pyroute2:
this is the agent's, never a CNI call's, path).

Every such route carries ``PROTOCOL`` (the rtnetlink protocol number, shown by
``ip route`` as ``proto 115``), so that a restarted agent finds its own routes and
nothing else: a route of another protocol is never replaced or deleted, and a
delete names the protocol, so the kernel refuses to remove anybody else's.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, NamedTuple

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

PROTOCOL = 115  # unassigned in iproute2's rt_protos; "s"
MAIN_TABLE = 254
RTNH_F_ONLINK = 4


class PeerRoute(NamedTuple):
    """A route to a pod range: via the node's address, or (``tunnel``) through the
    tunnel device with that address as an on-link gateway."""

    dst: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    tunnel: bool = False


class PeerRouteError(Exception):
    """The kernel refused a route; the message names it."""


def _network(msg: Any) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{msg.get('dst') or '0.0.0.0'}/{msg['dst_len']}")


def kept_routes(ipr: IPRoute, tunnel_index: int | None) -> dict[ipaddress.IPv4Network, PeerRoute]:
    """The main table's routes of PROTOCOL (metric 0), by destination."""
    found = {}
    for msg in ipr.get_routes(family=socket.AF_INET, table=MAIN_TABLE, proto=PROTOCOL):
        gateway = msg.get("gateway")
        if not gateway or (msg.get("priority") or 0) != 0:
            continue
        tunnel = tunnel_index is not None and msg.get("oif") == tunnel_index
        found[_network(msg)] = PeerRoute(_network(msg), ipaddress.IPv4Address(gateway), tunnel)
    return found


def foreign_destinations(ipr: IPRoute) -> set[ipaddress.IPv4Network]:
    """Destinations of the main table's metric-0 routes of any other protocol: a
    route of ours to one of them would replace somebody else's."""
    return {
        _network(msg)
        for msg in ipr.get_routes(family=socket.AF_INET, table=MAIN_TABLE)
        if msg["proto"] != PROTOCOL and not (msg.get("priority") or 0)
    }


def write(ipr: IPRoute, route: PeerRoute, tunnel_index: int | None) -> None:
    """Add or replace the route (only ever one of ours: see foreign_destinations)."""
    fields: dict[str, Any] = {
        "dst": str(route.dst),
        "gateway": str(route.gateway),
        "proto": PROTOCOL,
        "table": MAIN_TABLE,
    }
    if route.tunnel:
        if tunnel_index is None:
            raise PeerRouteError(f"no tunnel device for the route to {route.dst}")
        fields.update(oif=tunnel_index, flags=RTNH_F_ONLINK)
    try:
        ipr.route("replace", **fields)
    except NetlinkError as err:
        via = f" via {route.gateway}" + (" (tunnel)" if route.tunnel else "")
        raise PeerRouteError(f"failed to write the route to {route.dst}{via}: {err}") from None


def remove(ipr: IPRoute, dst: ipaddress.IPv4Network) -> None:
    """Delete our route to ``dst``; absent is fine."""
    try:
        ipr.route("del", dst=str(dst), proto=PROTOCOL, table=MAIN_TABLE)
    except NetlinkError as err:
        if err.code not in (3, 2):  # ESRCH, ENOENT: already gone
            raise PeerRouteError(f"failed to remove the route to {dst}: {err}") from None
