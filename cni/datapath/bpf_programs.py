"""Loaded eBPF programs through bpf(2): their info, and test runs.

A test run runs a program on a packet no device sees: the datapath's
verdicts are tested, and measured, without a network.
"""

from __future__ import annotations

import ctypes

from cni.datapath.bpf import obj_info, syscall

PROG_TEST_RUN = 10  # the command (include/uapi/linux/bpf.h)
PROG_TYPE_NETFILTER = 32


class ProgInfo(ctypes.Structure):
    """The leading fields of struct bpf_prog_info."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
    ]


class _TestRun(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 60),
    ]


class SkBuff(ctypes.Structure):
    """struct __sk_buff, the context of a tc program (include/uapi/linux/bpf.h).

    For BPF_PROG_TEST_RUN the kernel takes mark, priority, ingress_ifindex,
    ifindex (a device in the caller's network namespace), cb, tstamp,
    wire_len, gso_segs, gso_size and hwtstamp from it; every other field must
    be zero.
    """

    _fields_ = [
        ("len", ctypes.c_uint32),
        ("pkt_type", ctypes.c_uint32),
        ("mark", ctypes.c_uint32),
        ("queue_mapping", ctypes.c_uint32),
        ("protocol", ctypes.c_uint32),
        ("vlan_present", ctypes.c_uint32),
        ("vlan_tci", ctypes.c_uint32),
        ("vlan_proto", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("ingress_ifindex", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("tc_index", ctypes.c_uint32),
        ("cb", ctypes.c_uint32 * 5),
        ("hash", ctypes.c_uint32),
        ("tc_classid", ctypes.c_uint32),
        ("data", ctypes.c_uint32),
        ("data_end", ctypes.c_uint32),
        ("napi_id", ctypes.c_uint32),
        ("family", ctypes.c_uint32),
        ("remote_ip4", ctypes.c_uint32),
        ("local_ip4", ctypes.c_uint32),
        ("remote_ip6", ctypes.c_uint32 * 4),
        ("local_ip6", ctypes.c_uint32 * 4),
        ("remote_port", ctypes.c_uint32),
        ("local_port", ctypes.c_uint32),
        ("data_meta", ctypes.c_uint32),
        ("flow_keys", ctypes.c_uint64),
        ("tstamp", ctypes.c_uint64),
        ("wire_len", ctypes.c_uint32),
        ("gso_segs", ctypes.c_uint32),
        ("sk", ctypes.c_uint64),
        ("gso_size", ctypes.c_uint32),
        ("tstamp_type", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("hwtstamp", ctypes.c_uint64),
    ]


def prog_info(fd: int) -> ProgInfo:
    info = ProgInfo()
    obj_info(fd, info, "failed to read program info")
    return info


def test_run(
    prog_fd: int, data: bytes, ctx: SkBuff | None = None, repeat: int = 1
) -> tuple[int, bytes, SkBuff | None, int]:
    """Run a program once (or ``repeat`` times) on a packet: (return value, packet out,
    context out, mean nanoseconds per run). No device sees the packet."""
    data_in = ctypes.create_string_buffer(data, len(data))
    data_out = ctypes.create_string_buffer(len(data) + 256)
    ctx_out = SkBuff() if ctx is not None else None
    attr = _TestRun(
        prog_fd=prog_fd,
        data_size_in=len(data),
        data_size_out=ctypes.sizeof(data_out),
        data_in=ctypes.addressof(data_in),
        data_out=ctypes.addressof(data_out),
        repeat=repeat,
    )
    if ctx is not None and ctx_out is not None:
        attr.ctx_size_in = attr.ctx_size_out = ctypes.sizeof(SkBuff)
        attr.ctx_in = ctypes.addressof(ctx)
        attr.ctx_out = ctypes.addressof(ctx_out)
    syscall(PROG_TEST_RUN, attr, "failed to test-run the program")
    retval = ctypes.c_int32(attr.retval).value
    return retval, data_out.raw[: attr.data_size_out], ctx_out, attr.duration
