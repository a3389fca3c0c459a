"""The pinned programs on a device's hooks: pinned tcx links, or clsact filters.

Attachment uses tcx links (kernel 6.6+): no qdisc, so other tc users such
as the bandwidth plugin's ingress qdisc keep working, and the programs
return "next" on allow so that they run too. Each link is pinned under
``<bpfDir>/links/<ifindex>_<program>`` (a link lives as long as its pin); a
reload swaps the program inside every link in one step. Kernels without tcx
get a clsact qdisc with direct-action filters instead.

Programs are attached by the pinned programs' fds: no bcc, no compile. A new
tcx link is created before the state lock is taken and pinned under it.
"""

from __future__ import annotations

import contextlib
import errno
import os

from cni.datapath import bpf, bpf_links, bpf_programs
from cni.datapath.maps import Datapath
from cni.net.netlink import NetlinkError, Rtnl, kernel_op

# program -> (tcx attach type, clsact parent)
Hooks = dict[str, tuple[int, str]]
HOOKS: Hooks = {
    "from_pod": (bpf_links.TCX_INGRESS, "ffff:fff2"),
    "to_pod": (bpf_links.TCX_EGRESS, "ffff:fff3"),
}
UPLINK_HOOKS: Hooks = {
    "uplink": (bpf_links.TCX_EGRESS, "ffff:fff3"),
    "from_network": (bpf_links.TCX_INGRESS, "ffff:fff2"),
}
FILTER_HANDLE = 1
FILTER_PRIO = 1
LINKS = "links"


def link_path(bpf_dir: str, ifindex: int, program: str) -> str:
    return os.path.join(bpf_dir, LINKS, f"{ifindex}_{program}")


def program_fd(datapath: Datapath, program: str) -> int:
    """An fd for the program pinned now (the caller closes it)."""
    return bpf.obj_get(datapath.path(program))


def attach_programs(
    datapath: Datapath,
    ipr: Rtnl | None,
    ifindex: int,
    name: str,
    hooks: Hooks = HOOKS,
    *,
    tcx: bool = True,
) -> None:
    """The pinned programs on the device's hooks: tcx links (where the kernel has them
    and ``tcx``), else clsact filters (with ``ipr``, or a node socket of its own when
    it is None)."""
    if tcx and _attach_links(ifindex, datapath, hooks):
        return
    with contextlib.ExitStack() as stack:
        if ipr is None:
            ipr = stack.enter_context(Rtnl())
        with datapath.lock:
            with kernel_op(f'add clsact to "{name}"'):
                try:
                    ipr.add_clsact(ifindex)
                except NetlinkError as err:
                    if err.code != errno.EEXIST:
                        raise
            with kernel_op(f'attach the datapath to "{name}"'):
                set_filters(ipr, ifindex, datapath, hooks, replace=False)


def detach_programs(datapath: Datapath, ipr: Rtnl, ifindex: int) -> None:
    """Take the programs off the veth, keeping its endpoint entry."""
    with datapath.lock:
        unpin_links(datapath, ifindex, HOOKS)
    with contextlib.suppress(NetlinkError):
        ipr.delete_clsact(ifindex)


def unpin_links(datapath: Datapath, ifindex: int, hooks: Hooks) -> None:
    for program in hooks:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link_path(datapath.bpf_dir, ifindex, program))


def clsact_parent(hook: str) -> int:
    """A clsact hook's parent handle as a number ("ffff:fff2" -> 0xFFFFFFF2)."""
    return int(hook.replace(":", ""), 16)


def set_filters(ipr: Rtnl, ifindex: int, datapath: Datapath, hooks: Hooks, replace: bool) -> None:
    """The pinned programs as clsact direct-action filters (``replace``: over older ones)."""
    for program, (_, parent) in hooks.items():
        fd = program_fd(datapath, program)
        try:
            ipr.set_bpf_filter(
                ifindex,
                clsact_parent(parent),
                FILTER_HANDLE,
                FILTER_PRIO,
                fd,
                f"sluice_{program}",
                replace=replace,
            )
        finally:
            os.close(fd)


def _attach_links(ifindex: int, datapath: Datapath, hooks: Hooks) -> bool:
    """Pinned tcx links for the programs; False when the kernel has no tcx.

    Each link_create makes the kernel wait for an RCU grace period, so the links
    are created outside the state lock and pinned under it. A reload that pinned
    new programs in between has switched every pinned link but these: they are
    switched here, under the lock, before they are pinned."""
    os.makedirs(datapath.path(LINKS), exist_ok=True)
    hooks = {p: hook for p, hook in hooks.items() if not _adopt_link(ifindex, datapath, p, hook)}
    if not hooks:
        return True
    made = _create_links(ifindex, datapath, hooks)
    if made is None:
        return False
    try:
        with datapath.lock:
            for program, link_fd, prog_fd in made:
                pinned = program_fd(datapath, program)
                try:
                    if bpf_programs.prog_info(pinned).id != bpf_programs.prog_info(prog_fd).id:
                        bpf_links.link_update(link_fd, pinned)
                finally:
                    os.close(pinned)
                path = link_path(datapath.bpf_dir, ifindex, program)
                if os.path.exists(path):  # a leftover of an earlier device with this ifindex
                    os.unlink(path)
                bpf.obj_pin(link_fd, path)
    finally:
        for _, link_fd, prog_fd in made:
            os.close(link_fd)
            os.close(prog_fd)
    return True


def _adopt_link(ifindex: int, datapath: Datapath, program: str, hook: tuple[int, str]) -> bool:
    """True when the device already has the program's pinned link, an earlier
    process's (an uplink's or the tunnel's, which outlive an agent's restart); it is
    pointed at the program pinned now. The kernel refuses a second link of one
    program on one hook (EEXIST)."""
    path = link_path(datapath.bpf_dir, ifindex, program)
    if not os.path.exists(path):
        return False
    with datapath.lock:
        try:
            link_fd = bpf.obj_get(path)
        except bpf.BPFError:
            return False  # unpinned meanwhile
        try:
            info = bpf_links.link_info(link_fd)
            if info.ifindex != ifindex or info.attach_type != hook[0]:
                return False  # detached: its device is gone, the ifindex reused
            prog_fd = program_fd(datapath, program)
            try:
                if bpf_programs.prog_info(prog_fd).id != info.prog_id:
                    bpf_links.link_update(link_fd, prog_fd)
            finally:
                os.close(prog_fd)
        finally:
            os.close(link_fd)
    return True


Made = tuple[str, int, int]  # (program, link fd, program fd)


def _create_links(ifindex: int, datapath: Datapath, hooks: Hooks) -> list[Made] | None:
    """One tcx link per program; None when the kernel has no tcx."""
    made: list[Made] = []
    try:
        for index, (program, (attach_type, _)) in enumerate(hooks.items()):
            prog_fd = program_fd(datapath, program)
            try:
                link_fd = bpf_links.link_create(prog_fd, ifindex, attach_type)
            except bpf.BPFError as err:
                os.close(prog_fd)
                if err.errno in (errno.EINVAL, errno.EOPNOTSUPP) and index == 0:
                    return None
                raise
            made.append((program, link_fd, prog_fd))
    except BaseException:
        for _, link_fd, prog_fd in made:
            os.close(link_fd)
            os.close(prog_fd)
        raise
    return made
