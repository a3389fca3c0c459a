"""Routes on a link: added from plain specs, listed as the kernel has them."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from cni.net.netlink import Rtnl, kernel_op

SCOPE_UNIVERSE = 0
SCOPE_LINK = 253
MAIN_TABLE = 254
# An address no pod or node owns; the route to it is the node's default route.
OUTSIDE_ADDRESS = "192.0.2.1"  # TEST-NET-1 (RFC 5737)


class RouteSpec(NamedTuple):
    dst: str  # CIDR
    gw: str = ""  # "" when on-link
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


class KernelRoute(NamedTuple):
    dst: str  # CIDR
    gw: str  # "" when on-link
    scope: int
    table: int
    priority: int


def add_route(rtnl: Rtnl, index: int, ifname: str, route: RouteSpec) -> None:
    dst = ipaddress.IPv4Network(route.dst, strict=False)
    default_scope = SCOPE_UNIVERSE if route.gw else SCOPE_LINK
    scope = default_scope if route.scope is None else route.scope
    metrics = {k: v for k, v in (("RTAX_MTU", route.mtu), ("RTAX_ADVMSS", route.advmss)) if v}
    via = f" via {route.gw}" if route.gw else ""
    with kernel_op(f'add route {route.dst}{via} on "{ifname}"'):
        rtnl.add_route(
            str(dst.network_address),
            dst.prefixlen,
            index,
            gateway=route.gw,
            scope=scope,
            table=MAIN_TABLE if route.table is None else route.table,
            priority=route.priority,
            metrics=metrics,
        )


def add_route_to_pod(rtnl: Rtnl, index: int, ifname: str, ip: str) -> None:
    """The node's route to one pod address through the pod's veth."""
    add_route(rtnl, index, ifname, RouteSpec(dst=f"{ip}/32", scope=SCOPE_LINK))


def routes(rtnl: Rtnl, index: int) -> list[KernelRoute]:
    """IPv4 routes through the link (the kernel's local table left out)."""
    found = []
    for msg in rtnl.dump_routes(index):
        dst = msg.get("RTA_DST") or "0.0.0.0"
        found.append(
            KernelRoute(
                dst=str(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)),
                gw=msg.get("RTA_GATEWAY") or "",
                scope=msg["scope"],
                table=msg.get("RTA_TABLE") or msg["table"],
                priority=msg.get("RTA_PRIORITY") or 0,
            )
        )
    return found


def output_interface(rtnl: Rtnl, ip: str) -> int | None:
    """The ifindex the node routes ``ip`` out of, if any (a route lookup, not a dump)."""
    oif = rtnl.get_route(ip).get("RTA_OIF")
    return int(oif) if oif else None
