"""Links, veth pairs in particular: creation, lookup, listing and removal."""

from __future__ import annotations

from typing import Any, NamedTuple

from cni.net.netlink import NetlinkError, Rtnl, is_missing, kernel_op
from cni.net.route import OUTSIDE_ADDRESS, output_interface

# Every node-side veth carries the same MAC, so a pod's static neighbour entry
# for its gateway never depends on which veth it got.
NODE_VETH_MAC = "ee:ee:ee:ee:ee:ee"
IFF_UP = 0x1


class Link(NamedTuple):
    index: int  # type: ignore[assignment]  # the kernel's name; shadows tuple.index, unused
    name: str
    mac: str
    mtu: int
    kind: str
    up: bool
    alias: str | None


def get_link(rtnl: Rtnl, name: str) -> Link | None:
    try:
        return _to_link(rtnl.get_link(name))
    except NetlinkError as err:
        if is_missing(err):
            return None
        raise


def link_by_index(rtnl: Rtnl, index: int) -> Link | None:
    try:
        return _to_link(rtnl.get_link(index=index))
    except NetlinkError as err:
        if is_missing(err):
            return None
        raise


def _to_link(msg: Any) -> Link:
    """A Link from an ifinfmsg."""
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


def links_with_alias(rtnl: Rtnl, prefix: str) -> list[Link]:
    """Every link whose alias starts with ``prefix``."""
    found = []
    for msg in rtnl.dump_links():
        alias = msg.get("IFLA_IFALIAS")
        if alias and alias.startswith(prefix):
            found.append(_to_link(msg))
    return found


def create_veth(
    node: Rtnl,
    node_veth: str,
    alias: str,
    pod_ifname: str,
    pod_ns_fd: int,
    mtu: int,
    pod_mac: str | None,
) -> int:
    """Create the pair with the pod end directly inside the pod's namespace (both down);
    return the node-side veth's ifindex."""
    with kernel_op(f'create veth "{node_veth}" with peer "{pod_ifname}"'):
        node.add_veth(node_veth, NODE_VETH_MAC, mtu, pod_ifname, pod_ns_fd, pod_mac)
    # The kernel ignores IFLA_IFALIAS in RTM_NEWLINK for a new link: set it afterwards.
    with kernel_op(f'label veth "{node_veth}"'):
        index = node.get_link(node_veth)["index"]
        node.set_link(index, alias=alias)
    return int(index)


def delete_link(rtnl: Rtnl, name: str) -> bool:
    """Delete a link by name; False when it was already gone."""
    try:
        rtnl.delete_link(name)
    except NetlinkError as err:
        if is_missing(err):
            return False
        with kernel_op(f'delete link "{name}"'):
            raise
    return True


def delete_link_index(rtnl: Rtnl, index: int, name: str) -> bool:
    """Delete the link with this ifindex (never a newer link that took its name);
    False when it was already gone."""
    try:
        rtnl.delete_link(index=index)
    except NetlinkError as err:
        if is_missing(err):
            return False
        with kernel_op(f'delete link "{name}" (ifindex {index})'):
            raise
    return True


def set_up(rtnl: Rtnl, index: int, name: str) -> None:
    with kernel_op(f'set "{name}" up'):
        rtnl.set_link(index, up=True)


def set_down(rtnl: Rtnl, index: int, name: str) -> bool:
    """False when the link was already gone."""
    try:
        rtnl.set_link(index, up=False)
    except NetlinkError as err:
        if is_missing(err):
            return False
        with kernel_op(f'set "{name}" down'):
            raise
    return True


def default_route_link(rtnl: Rtnl) -> Link | None:
    """The interface carrying the node's default route, if there is one."""
    try:
        oif = output_interface(rtnl, OUTSIDE_ADDRESS)
    except NetlinkError:  # no route to the outside
        return None
    return link_by_index(rtnl, oif) if oif else None


def default_route_mtu(rtnl: Rtnl) -> int | None:
    found = default_route_link(rtnl)
    return found.mtu if found else None


def default_route_interface(rtnl: Rtnl) -> str | None:
    found = default_route_link(rtnl)
    return found.name if found else None
