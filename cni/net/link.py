"""Links, veth pairs in particular: creation, lookup, listing and removal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.net.netlink import IPRoute, NetlinkError, is_missing, kernel_op
from cni.net.route import OUTSIDE_ADDRESS, output_interface

# Every node-side veth carries the same MAC, so a pod's static neighbour entry
# for its gateway never depends on which veth it got.
NODE_VETH_MAC = "ee:ee:ee:ee:ee:ee"
IFF_UP = 0x1


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    kind: str
    up: bool
    alias: str | None


def get_link(ipr: IPRoute, name: str) -> Link | None:
    try:
        (msg,) = ipr.link("get", ifname=name)
    except NetlinkError as err:
        if is_missing(err):
            return None
        raise
    return _to_link(msg)


def _to_link(msg: Any) -> Link:
    """A Link from pyroute2's ifinfmsg."""
    info = msg.get("IFLA_LINKINFO")
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        mac=msg.get("IFLA_ADDRESS") or "",
        mtu=msg.get("IFLA_MTU") or 0,
        kind=(info.get("IFLA_INFO_KIND") if info else "") or "",
        up=bool(msg["flags"] & IFF_UP),
        alias=msg.get("IFLA_IFALIAS"),
    )


def links_with_alias(ipr: IPRoute, prefix: str) -> list[Link]:
    """Every link whose alias starts with ``prefix``."""
    found = []
    for msg in ipr.link("dump"):
        alias = msg.get("IFLA_IFALIAS")
        if alias and alias.startswith(prefix):
            found.append(_to_link(msg))
    return found


def create_veth(
    node: IPRoute,
    node_veth: str,
    alias: str,
    pod_ifname: str,
    pod_ns_fd: int,
    mtu: int,
    pod_mac: str | None,
) -> None:
    """Create the pair with the pod end directly inside the pod's namespace (both down)."""
    peer: dict[str, object] = {"ifname": pod_ifname, "net_ns_fd": pod_ns_fd, "mtu": mtu}
    if pod_mac:
        peer["address"] = pod_mac
    with kernel_op(f'create veth "{node_veth}" with peer "{pod_ifname}"'):
        node.link("add", ifname=node_veth, kind="veth", address=NODE_VETH_MAC, mtu=mtu, peer=peer)
    # The kernel ignores IFLA_IFALIAS in RTM_NEWLINK; it must be set afterwards.
    with kernel_op(f'label veth "{node_veth}"'):
        node.link("set", ifname=node_veth, ifalias=alias)


def delete_link(ipr: IPRoute, name: str) -> bool:
    """Delete a link by name; False when it was already gone."""
    try:
        ipr.link("del", ifname=name)
    except NetlinkError as err:
        if is_missing(err):
            return False
        with kernel_op(f'delete link "{name}"'):
            raise
    return True


def set_up(ipr: IPRoute, index: int, name: str) -> None:
    with kernel_op(f'set "{name}" up'):
        ipr.link("set", index=index, state="up")


def default_route_mtu(ipr: IPRoute) -> int | None:
    """MTU of the interface carrying the node's default route, if there is one."""
    try:
        oif = output_interface(ipr, OUTSIDE_ADDRESS)
    except NetlinkError:  # no route to the outside
        return None
    if oif is None:
        return None
    (msg,) = ipr.link("get", index=oif)
    return msg.get("IFLA_MTU")
