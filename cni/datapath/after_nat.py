"""after_nat (bpf/after_nat.c) on netfilter's FORWARD and LOCAL_IN hooks.

Flows from egress-isolated pods to ClusterIPs are judged there, after
kube-proxy's DNAT and before any masquerading, whatever device they leave by
and when the backend is the node itself (bpf/services.h). The links belong to
the node's network namespace and are pinned under ``<bpfDir>/nf_links`` so that
they outlive the agent. ``config.after_nat`` tells the from-pod program that
they are in place; until it is set, such flows are dropped (``drop-unjudged``).

A netfilter link cannot change its program: after a reload, a new link is made
and pinned over the old one, so for a moment both judge alike, never neither.
The kernel takes one BPF program per hook and priority (EBUSY for a second), so
a link takes the first free priority of a range: the new link of a reload, and
each datapath of several networks on one node, each get their own.
"""

from __future__ import annotations

import contextlib
import errno
import os

from cni.datapath import bpf, bpf_links, bpf_programs
from cni.datapath.maps import Datapath

PROGRAM = "after_nat"
LINKS = "nf_links"
HOOKS = {"forward": bpf_links.NF_INET_FORWARD, "local_in": bpf_links.NF_INET_LOCAL_IN}
# After the filter table (0), before LOCAL_IN's SNAT (100); FORWARD has no NAT.
PRIORITIES = range(1, 100)


def link_path(datapath: Datapath, hook: str) -> str:
    return os.path.join(datapath.bpf_dir, LINKS, hook)


def attach(datapath: Datapath) -> None:
    """Put the pinned program on both hooks (a link that runs another program is
    replaced), then tell the from-pod program. Raises BPFError (the kernel has no
    netfilter programs, or none was pinned: DatapathMissing) and leaves flows to
    ClusterIPs from egress-isolated pods refused."""
    prog_fd = bpf.obj_get(datapath.path(PROGRAM))
    try:
        prog_id = bpf_programs.prog_info(prog_fd).id
        os.makedirs(datapath.path(LINKS), exist_ok=True)
        for hook, hooknum in HOOKS.items():
            if _linked_program(datapath, hook) == prog_id:
                continue
            link_fd = _link(prog_fd, hooknum)
            try:
                staging = f"{link_path(datapath, hook)}_new"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staging)
                bpf.obj_pin(link_fd, staging)
                os.replace(staging, link_path(datapath, hook))  # the old link goes now
            finally:
                os.close(link_fd)
    finally:
        os.close(prog_fd)
    datapath.set_config(after_nat=1)


def _link(prog_fd: int, hooknum: int) -> int:
    """A link at the first priority no other BPF program holds on the hook."""
    for priority in PRIORITIES:
        try:
            return bpf_links.netfilter_link_create(prog_fd, hooknum, priority)
        except bpf.BPFError as err:
            if err.errno != errno.EBUSY:
                raise
    raise bpf.BPFError(
        errno.EBUSY,
        f"every priority {PRIORITIES.start}-{PRIORITIES.stop - 1} of hook "
        f"{hooknum} holds another BPF program",
    )


def detach(datapath: Datapath) -> None:
    """Off both hooks; flows to ClusterIPs from egress-isolated pods are refused first."""
    datapath.set_config(after_nat=0)
    for hook in HOOKS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link_path(datapath, hook))


def attached(datapath: Datapath) -> list[str]:
    """The hooks whose link runs the pinned program now."""
    try:
        prog_fd = bpf.obj_get(datapath.path(PROGRAM))
    except bpf.BPFError:
        return []
    try:
        prog_id = bpf_programs.prog_info(prog_fd).id
    finally:
        os.close(prog_fd)
    return [hook for hook in HOOKS if _linked_program(datapath, hook) == prog_id]


def _linked_program(datapath: Datapath, hook: str) -> int | None:
    try:
        link_fd = bpf.obj_get(link_path(datapath, hook))
    except bpf.BPFError:
        return None
    try:
        return int(bpf_links.link_info(link_fd).prog_id)
    finally:
        os.close(link_fd)
