"""The node's uplinks: the programs on the devices that lead off the node.

``uplink`` (tcx egress) judges service flows leaving the node; ``from_network``
(tcx ingress) what the node network sends in (pod sources, the tunnel). An
uplink's links stay pinned when the agent stops; the next one adopts them
(``cni.datapath.attach``).
"""

from __future__ import annotations

# _socket, not socket: the module's enums and selectors cost a one-call process.
import _socket as socket
import contextlib
import os

from cni.datapath import bpf
from cni.datapath.attach import (
    FILTER_HANDLE,
    FILTER_PRIO,
    LINKS,
    UPLINK_HOOKS,
    attach_programs,
    clsact_parent,
    link_path,
    unpin_links,
)
from cni.datapath.maps import Datapath
from cni.net.netlink import NetlinkError, Rtnl
from cni.spec.errors import ERR_KERNEL, CNIError

ARPHRD_ETHER = 1


def attach_uplink(datapath: Datapath, ipr: Rtnl, name: str) -> int:
    """Judge service flows leaving the node through ``name`` (an Ethernet device), and
    what it receives from the node network (pod sources, the tunnel); return its
    ifindex. Idempotent."""
    # Asked over rtnetlink, not sysfs: a process that entered a network namespace
    # without remounting /sys still sees the host's /sys/class/net.
    try:
        found = ipr.get_link(name)
    except NetlinkError as err:
        raise CNIError(ERR_KERNEL, f'no uplink "{name}": {err}') from None
    ifindex = found["index"]
    if found["ifi_type"] != ARPHRD_ETHER:
        raise CNIError(ERR_KERNEL, f'uplink "{name}" is not an Ethernet device')
    try:
        with datapath.lock:
            attach_programs(datapath, ipr, ifindex, name, UPLINK_HOOKS)
    except bpf.BPFError as err:
        message = f'failed to attach the uplink program to "{name}": {err}'
        raise CNIError(ERR_KERNEL, message) from None
    return ifindex


def detach_uplink(datapath: Datapath, ipr: Rtnl, name: str) -> None:
    ifindex = socket.if_nametoindex(name)
    with datapath.lock:
        if os.path.exists(link_path(datapath.bpf_dir, ifindex, "uplink")):
            unpin_links(datapath, ifindex, UPLINK_HOOKS)
            return
    for _, parent in UPLINK_HOOKS.values():
        with contextlib.suppress(NetlinkError):
            ipr.delete_bpf_filter(ifindex, clsact_parent(parent), FILTER_HANDLE, FILTER_PRIO)


def uplinks(datapath: Datapath) -> list[int]:
    """ifindexes with a pinned uplink link."""
    links_dir = datapath.path(LINKS)
    if not os.path.isdir(links_dir):
        return []
    return sorted(int(p.split("_", 1)[0]) for p in os.listdir(links_dir) if p.endswith("_uplink"))
