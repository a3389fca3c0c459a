"""Routes on a link: added from plain specs, listed as the kernel has them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cni.net.netlink import IPRoute, kernel_op

SCOPE_LINK = 253
MAIN_TABLE = 254
LOCAL_TABLE = 255
AF_INET = 2
# An address no pod or node owns; the route to it is the node's default route.
OUTSIDE_ADDRESS = "192.0.2.1"  # TEST-NET-1 (RFC 5737)


@dataclass(frozen=True)
class RouteSpec:
    dst: str  # CIDR
    gw: str = ""  # "" when on-link
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@dataclass(frozen=True)
class KernelRoute:
    dst: str  # CIDR
    gw: str  # "" when on-link
    scope: int
    table: int
    priority: int


def add_route(ipr: IPRoute, index: int, ifname: str, route: RouteSpec) -> None:
    kwargs: dict[str, object] = {"dst": route.dst, "oif": index}
    if route.gw:
        kwargs["gateway"] = route.gw
    else:
        kwargs["scope"] = SCOPE_LINK if route.scope is None else route.scope
    if route.priority:
        kwargs["priority"] = route.priority
    if route.table is not None:
        kwargs["table"] = route.table
    if route.mtu or route.advmss:
        kwargs["metrics"] = {
            k: v for k, v in (("RTAX_MTU", route.mtu), ("RTAX_ADVMSS", route.advmss)) if v
        }
    via = f" via {route.gw}" if route.gw else ""
    with kernel_op(f'add route {route.dst}{via} on "{ifname}"'):
        ipr.route("add", **kwargs)


def add_route_to_pod(ipr: IPRoute, index: int, ifname: str, ip: str) -> None:
    """The node's route to one pod address through the pod's veth."""
    add_route(ipr, index, ifname, RouteSpec(dst=f"{ip}/32", scope=SCOPE_LINK))


def routes(ipr: IPRoute, index: int) -> list[KernelRoute]:
    """IPv4 routes through the link (the kernel's local table left out)."""
    found = []
    for msg in ipr.route("dump", family=AF_INET, oif=index):
        if msg.get("RTA_OIF") != index:
            continue
        table = msg.get("RTA_TABLE") or msg["table"]
        if table == LOCAL_TABLE:
            continue
        dst = msg.get("RTA_DST") or "0.0.0.0"
        found.append(
            KernelRoute(
                dst=str(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)),
                gw=msg.get("RTA_GATEWAY") or "",
                scope=msg["scope"],
                table=table,
                priority=msg.get("RTA_PRIORITY") or 0,
            )
        )
    return found


def output_interface(ipr: IPRoute, ip: str) -> int | None:
    """The ifindex the node routes ``ip`` out of, if any (a route lookup, not a dump)."""
    for msg in ipr.route("get", dst=ip):
        oif = msg.get("RTA_OIF")
        if oif:
            return int(oif)
    return None
