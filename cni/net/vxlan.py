"""The VXLAN tunnel of ``"routing": "vxlan"`` (pyroute2; the agent's path only).

One device per node, ``DEVICE``, with the network's VNI and UDP port (by default
``VNI`` on 4789, IANA's), without learning: every remote node is a static peer,
written from its Node object:

- a permanent neighbour entry: its InternalIP (the on-link gateway of the routes
  to its pods) is at ``vtep_mac(InternalIP)``;
- a permanent FDB entry: that MAC is behind the node's InternalIP.

The MAC is derived from the address (``02:73`` and the four bytes), so every node
computes every other node's without writing anything to the API. The device's
own MAC is ``vtep_mac`` of this node's InternalIP, so what the others send it is
delivered to the node's stack and routed to the pod.

The device holds one address of the node's own pod range (its network address,
which no pod gets), the tunnel address: the node's own traffic to other nodes'
pods leaves from it, so that the receiver routes its source back through the
tunnel (a strict reverse-path filter accepts it) and the pod's replies return
the same way.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, NamedTuple

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

DEVICE = "sluice.vx"
VNI = 7346
PORT = 4789
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
ENOENT, ESRCH = 2, 3


class TunnelError(Exception):
    """The kernel refused a part of the tunnel; the message names it."""


class Tunnel(NamedTuple):
    index: int  # type: ignore[assignment]  # the kernel's name; shadows tuple.index, unused
    local: ipaddress.IPv4Address
    mtu: int


def vtep_mac(address: ipaddress.IPv4Address) -> str:
    """A locally administered unicast MAC that names the node's address."""
    return ":".join(f"{b:02x}" for b in (0x02, 0x73, *address.packed))


def _link_index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def device_index(ipr: IPRoute) -> int | None:
    return _link_index(ipr, DEVICE)


def uplink_mtu(ipr: IPRoute, local: ipaddress.IPv4Address) -> int | None:
    """The MTU of the interface that holds the node's address."""
    for msg in ipr.get_addr(family=socket.AF_INET, address=str(local)):
        links = ipr.get_links(msg["index"])
        if links:
            return int(links[0].get("mtu") or 0) or None
    return None


def _matches(ipr: IPRoute, index: int, local: ipaddress.IPv4Address, port: int, vni: int) -> bool:
    info = ipr.get_links(index)[0].get("IFLA_LINKINFO")
    if info is None or info.get("IFLA_INFO_KIND") != "vxlan":
        return False
    data = info.get("IFLA_INFO_DATA")
    return (
        data.get("IFLA_VXLAN_ID") == vni
        and data.get("IFLA_VXLAN_LOCAL") == str(local)
        and data.get("IFLA_VXLAN_PORT") == port
        and not data.get("IFLA_VXLAN_LEARNING")
    )


def ensure(
    ipr: IPRoute,
    local: ipaddress.IPv4Address,
    mtu: int,
    port: int = PORT,
    vni: int = VNI,
    address: ipaddress.IPv4Address | None = None,
) -> Tunnel:
    """The device as this node needs it: created, or recreated when its VNI, port or
    local address differ (the node's address changed); MTU and MAC set; its one
    address ``address`` (the tunnel address; None: none); up."""
    mac = vtep_mac(local)
    try:
        index = device_index(ipr)
        if index is not None and not _matches(ipr, index, local, port, vni):
            ipr.link("del", index=index)
            index = None
        if index is None:
            ipr.link(
                "add",
                ifname=DEVICE,
                kind="vxlan",
                vxlan_id=vni,
                vxlan_local=str(local),
                vxlan_port=port,
                vxlan_learning=0,
                address=mac,
                mtu=mtu,
            )
            index = device_index(ipr)
            assert index is not None
        ipr.link("set", index=index, address=mac, mtu=mtu, state="up")
        _only_address(ipr, index, address)
    except NetlinkError as err:
        raise TunnelError(
            f"failed to set up {DEVICE} (local {local}, port {port}, VNI {vni}, MTU {mtu}, "
            f"address {address}): {err}"
        ) from None
    return Tunnel(index, local, mtu)


def _only_address(ipr: IPRoute, index: int, address: ipaddress.IPv4Address | None) -> None:
    """``address``/32 on the device, and no other IPv4 address."""
    present = {
        msg.get_attr("IFA_ADDRESS"): msg["prefixlen"]
        for msg in ipr.get_addr(family=socket.AF_INET, index=index)
    }
    for other, prefixlen in present.items():
        if address is None or other != str(address) or prefixlen != 32:
            ipr.addr("del", index=index, address=other, prefixlen=prefixlen)
    if address is not None and present.get(str(address)) != 32:
        ipr.addr("add", index=index, address=str(address), prefixlen=32)


def tunnel_address(pod_range: ipaddress.IPv4Network | None) -> ipaddress.IPv4Address | None:
    """The node's tunnel address: its pod range's network address, which the node-CIDR
    IPAM never hands out (None without a single range: prefix mode)."""
    return pod_range.network_address if pod_range is not None else None


def remove_device(ipr: IPRoute) -> bool:
    """Delete the device (routing is no longer vxlan); whether there was one."""
    index = device_index(ipr)
    if index is None:
        return False
    try:
        ipr.link("del", index=index)
    except NetlinkError as err:
        if err.code != 19:  # ENODEV
            raise TunnelError(f"failed to remove {DEVICE}: {err}") from None
    return True


def peers(
    ipr: IPRoute, index: int
) -> tuple[set[ipaddress.IPv4Address], set[ipaddress.IPv4Address]]:
    """Node addresses on the device: (with both a permanent neighbour and an FDB
    entry, with either)."""
    neighbours = {
        ipaddress.IPv4Address(msg.get("dst"))
        for msg in ipr.get_neighbours(family=socket.AF_INET, ifindex=index)
        if msg["state"] & NUD_PERMANENT and msg.get("dst")
    }
    fdb = {ipaddress.IPv4Address(msg.get("dst")) for msg in _fdb(ipr, index)}
    return neighbours & fdb, neighbours | fdb


def _fdb(ipr: IPRoute, index: int) -> list[Any]:
    return [
        msg
        for msg in ipr.get_neighbours(family=socket.AF_BRIDGE, ifindex=index)
        if msg["ifindex"] == index and msg.get("dst") and msg["state"] & NUD_PERMANENT
    ]


def write_peer(ipr: IPRoute, index: int, node: ipaddress.IPv4Address) -> None:
    mac = vtep_mac(node)
    try:
        ipr.neigh("replace", ifindex=index, dst=str(node), lladdr=mac, state=NUD_PERMANENT)
        ipr.fdb(
            "replace", ifindex=index, lladdr=mac, dst=str(node), state=NUD_PERMANENT, flags=NTF_SELF
        )
    except NetlinkError as err:
        raise TunnelError(f"failed to write the tunnel peer {node} ({mac}): {err}") from None


def remove_peer(ipr: IPRoute, index: int, node: ipaddress.IPv4Address) -> None:
    """Its neighbour and FDB entries; absent ones are fine."""
    for msg in _fdb(ipr, index):
        if msg.get("dst") == str(node):
            _absent_ok(
                lambda m=msg: ipr.fdb(
                    "del", ifindex=index, lladdr=m.get("lladdr"), dst=str(node), flags=NTF_SELF
                ),
                node,
            )
    _absent_ok(lambda: ipr.neigh("del", ifindex=index, dst=str(node)), node)


def _absent_ok(operation: Any, node: ipaddress.IPv4Address) -> None:
    try:
        operation()
    except NetlinkError as err:
        if err.code not in (ENOENT, ESRCH):
            raise TunnelError(f"failed to remove the tunnel peer {node}: {err}") from None
