"""veth pairs: names, creation, lookup and removal.

The node end of a pod's veth is named after the attachment, so DEL and GC find
it without the pod's namespace, and its alias records which attachment it
serves: ``sluice/<network>/<container id>/<ifname>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cni.net.netlink import IPRoute, NetlinkError, is_missing, kernel_op

NODE_VETH_PREFIX = "sl"
# Every node-side veth carries the same MAC, so a pod's static neighbour entry
# for its gateway never depends on which veth it got.
NODE_VETH_MAC = "ee:ee:ee:ee:ee:ee"
ALIAS_PREFIX = "sluice/"
IFF_UP = 0x1


def node_veth_name(container_id: str, ifname: str) -> str:
    digest = hashlib.sha256(f"{container_id}/{ifname}".encode()).hexdigest()
    return NODE_VETH_PREFIX + digest[:12]


def attachment_alias(network: str, container_id: str, ifname: str) -> str:
    return f"{ALIAS_PREFIX}{network}/{container_id}/{ifname}"


def parse_alias(alias: str | None) -> tuple[str, str, str] | None:
    """(network, container id, ifname) from a node-side veth alias, or None."""
    if not alias or not alias.startswith(ALIAS_PREFIX):
        return None
    parts = alias[len(ALIAS_PREFIX) :].split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


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


def attachment_links(ipr: IPRoute, network: str) -> list[tuple[Link, str, str]]:
    """Node-side veths of ``network`` with their (container id, ifname)."""
    found = []
    for msg in ipr.link("dump"):
        link = _to_link(msg)
        owner = parse_alias(link.alias)
        if owner and owner[0] == network:
            found.append((link, owner[1], owner[2]))
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
    for route in ipr.route("dump", family=2):
        oif = route.get("RTA_OIF")
        if route["dst_len"] == 0 and route.get("RTA_TABLE") == 254 and oif:
            (msg,) = ipr.link("get", index=oif)
            return msg.get("IFLA_MTU")
    return None
