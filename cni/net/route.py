"""Routes on a link, added and listed in the shape CNI results use."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cni.net.netlink import IPRoute, kernel_op
from cni.result import Route

SCOPE_LINK = 253
MAIN_TABLE = 254


@dataclass(frozen=True)
class KernelRoute:
    dst: str  # CIDR
    gw: str  # "" when on-link
    scope: int
    table: int
    priority: int


def add_route(ipr: IPRoute, index: int, ifname: str, route: Route) -> None:
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
    add_route(ipr, index, ifname, Route(dst=f"{ip}/32", scope=SCOPE_LINK))


def routes(ipr: IPRoute, index: int) -> list[KernelRoute]:
    found = []
    for msg in ipr.route("dump", family=2):
        if msg.get("RTA_OIF") != index:
            continue
        table = msg.get("RTA_TABLE") or msg["table"]
        if table == 255:  # the kernel's local table: not ours
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
