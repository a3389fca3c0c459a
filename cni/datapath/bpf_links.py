"""Programs attached to hooks with a bpf_link, through bpf(2).

A link lives as long as an fd or a pin holds it, and a tcx link's program
can be swapped inside it in one step (``link_update``).
"""

from __future__ import annotations

import ctypes

from cni.datapath.bpf import obj_info, syscall

# Commands (include/uapi/linux/bpf.h).
LINK_CREATE = 28
LINK_UPDATE = 29

# tcx attach points (kernel 6.6 and later): no qdisc, several programs per hook.
TCX_INGRESS = 46
TCX_EGRESS = 47

NETFILTER = 45  # attach type of netfilter links (kernel 6.4 and later)
NFPROTO_IPV4 = 2
NF_INET_LOCAL_IN = 1
NF_INET_FORWARD = 2


class _LinkCreate(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("relative_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("expected_revision", ctypes.c_uint64),
        ("padding", ctypes.c_uint8 * 96),
    ]


class _LinkUpdate(ctypes.Structure):
    _fields_ = [
        ("link_fd", ctypes.c_uint32),
        ("new_prog_fd", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("old_prog_fd", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 112),
    ]


class LinkInfo(ctypes.Structure):
    """struct bpf_link_info, as far as tcx links fill it."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 48),
    ]


class _NetfilterLinkCreate(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("pf", ctypes.c_uint32),
        ("hooknum", ctypes.c_uint32),
        ("priority", ctypes.c_int32),
        ("nf_flags", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 104),
    ]


def link_create(prog_fd: int, ifindex: int, attach_type: int) -> int:
    """Attach a program to a device hook with a bpf_link (tcx); the caller pins or closes it."""
    attr = _LinkCreate(prog_fd=prog_fd, target_ifindex=ifindex, attach_type=attach_type)
    return syscall(LINK_CREATE, attr, f"failed to attach to ifindex {ifindex}")


def netfilter_link_create(prog_fd: int, hooknum: int, priority: int) -> int:
    """Attach a netfilter program to an IPv4 hook of the caller's network namespace with
    a bpf_link; the caller pins or closes it. (Such links cannot change program.)"""
    attr = _NetfilterLinkCreate(
        prog_fd=prog_fd, attach_type=NETFILTER, pf=NFPROTO_IPV4, hooknum=hooknum,
        priority=priority,
    )  # fmt: skip
    return syscall(LINK_CREATE, attr, f"failed to attach to netfilter hook {hooknum}")


def link_update(link_fd: int, prog_fd: int) -> None:
    """Swap the link's program in one step."""
    syscall(LINK_UPDATE, _LinkUpdate(link_fd=link_fd, new_prog_fd=prog_fd), "failed to update link")


def link_info(fd: int) -> LinkInfo:
    info = LinkInfo()
    obj_info(fd, info, "failed to read link info")
    return info
