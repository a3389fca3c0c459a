"""After a reload: every endpoint and uplink pointed at the programs pinned now.

A tcx link's program is swapped inside the link in one step; a clsact
filter is replaced. A device gone meanwhile is forgotten, not switched.
"""

from __future__ import annotations

import errno
import os

from cni.datapath import bpf, bpf_links
from cni.datapath.attach import (
    HOOKS,
    UPLINK_HOOKS,
    Hooks,
    link_path,
    program_fd,
    set_filters,
    unpin_links,
)
from cni.datapath.endpoint import detach
from cni.datapath.maps import Datapath
from cni.datapath.uplink import uplinks
from cni.net.netlink import NetlinkError, Rtnl


def switch_programs(datapath: Datapath, ifindexes: list[int]) -> None:
    """Point every endpoint (and uplink) at the programs pinned now (after a reload)."""
    with datapath.lock, Rtnl() as ipr:
        for ifindex in ifindexes:
            if os.path.exists(link_path(datapath.bpf_dir, ifindex, "from_pod")):
                try:
                    _update_links(datapath, ifindex, HOOKS)
                except bpf.BPFError as err:
                    if err.errno != errno.ENOLINK:
                        raise
                    detach(datapath, ifindex)  # the veth is gone: nothing to switch
                continue
            try:
                set_filters(ipr, ifindex, datapath, HOOKS, replace=True)
            except NetlinkError as err:
                if err.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                    raise
        for ifindex in uplinks(datapath):
            try:
                _update_links(datapath, ifindex, UPLINK_HOOKS)
            except bpf.BPFError as err:
                if err.errno != errno.ENOLINK:
                    raise
                unpin_links(datapath, ifindex, UPLINK_HOOKS)


def _update_links(datapath: Datapath, ifindex: int, hooks: Hooks) -> None:
    for program in hooks:
        path = link_path(datapath.bpf_dir, ifindex, program)
        if program in UPLINK_HOOKS and not os.path.exists(path):
            continue  # an uplink of an earlier build: the agent attaches what it lacks
        link_fd = bpf.obj_get(path)
        prog_fd = program_fd(datapath, program)
        try:
            bpf_links.link_update(link_fd, prog_fd)
        finally:
            os.close(prog_fd)
            os.close(link_fd)
