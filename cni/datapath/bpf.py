"""The bpf(2) system call through ctypes: maps, pins and object info.

The CNI path uses only this module, never bcc: getting a pinned object's fd
costs about 0.1 ms, importing bcc tens of milliseconds and compiling a
second or more.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, TypeAlias

# A map key or value as ctypes knows it: a structure or a scalar (c_uint32, ...).
CValue: TypeAlias = "ctypes.Structure | ctypes._SimpleCData[Any]"

SYS_BPF = {"x86_64": 321, "aarch64": 280}[os.uname().machine]

# Commands (include/uapi/linux/bpf.h).
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
OBJ_PIN = 6
OBJ_GET = 7
PROG_TEST_RUN = 10
MAP_GET_FD_BY_ID = 14
OBJ_GET_INFO_BY_FD = 15
MAP_LOOKUP_BATCH = 24
MAP_UPDATE_BATCH = 26
MAP_DELETE_BATCH = 27
LINK_CREATE = 28
PROG_TYPE_NETFILTER = 32
NETFILTER = 45  # attach type of netfilter links (kernel 6.4 and later)
NFPROTO_IPV4 = 2
NF_INET_LOCAL_IN = 1
NF_INET_FORWARD = 2
LINK_UPDATE = 29

# tcx attach points (kernel 6.6 and later): no qdisc, several programs per hook.
TCX_INGRESS = 46
TCX_EGRESS = 47

# Map types and flags used here.
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_LRU_HASH = 9
MAP_TYPE_LPM_TRIE = 11
F_NO_PREALLOC = 1 << 0
ANY = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BPFError(OSError):
    pass


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    ret = _libc.syscall(SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise BPFError(err, f"{what}: {os.strerror(err)}")
    return int(ret)


class _MapCreate(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
        ("padding", ctypes.c_uint8 * 80),
    ]


class _MapElem(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # next_key for MAP_GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
        ("padding", ctypes.c_uint8 * 96),
    ]


class _Batch(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("padding", ctypes.c_uint8 * 80),
    ]


class _ObjPin(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 112),
    ]


class _InfoByFd(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
        ("padding", ctypes.c_uint8 * 112),
    ]


class _GetById(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint32),
        ("next_id", ctypes.c_uint32),
        ("open_flags", ctypes.c_uint32),
        ("padding", ctypes.c_uint8 * 116),
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


class MapInfo(ctypes.Structure):
    """The leading fields of struct bpf_map_info."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


def obj_get(path: str) -> int:
    """An fd for a pinned program or map (the caller closes it)."""
    name = path.encode()
    attr = _ObjPin(pathname=ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value or 0)
    return _bpf(OBJ_GET, attr, f'failed to open pinned object "{path}"')


def obj_pin(fd: int, path: str) -> None:
    name = path.encode()
    attr = _ObjPin(
        pathname=ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value or 0, bpf_fd=fd
    )
    _bpf(OBJ_PIN, attr, f'failed to pin "{path}"')


def map_create(
    map_type: int, key_size: int, value_size: int, max_entries: int, flags: int = 0, name: str = ""
) -> int:
    attr = _MapCreate(
        map_type=map_type,
        key_size=key_size,
        value_size=value_size,
        max_entries=max_entries,
        map_flags=flags,
        map_name=name.encode()[:15],
    )
    return _bpf(MAP_CREATE, attr, f"failed to create map {name!r}")


def _elem(
    fd: int, key: ctypes._CData | None, value: ctypes._CData | None, flags: int = 0
) -> _MapElem:
    return _MapElem(
        map_fd=fd,
        key=ctypes.addressof(key) if key is not None else 0,
        value=ctypes.addressof(value) if value is not None else 0,
        flags=flags,
    )


def map_update(fd: int, key: ctypes._CData, value: ctypes._CData, flags: int = ANY) -> None:
    _bpf(MAP_UPDATE_ELEM, _elem(fd, key, value, flags), "failed to update map element")


def map_update_batch(fd: int, keys: ctypes.Array, values: ctypes.Array) -> None:  # type: ignore[type-arg]
    """Update ``len(keys)`` elements in one call. For a map of maps the kernel waits
    for one RCU grace period for the whole batch, not one per element."""
    if not len(keys):
        return
    attr = _Batch(
        keys=ctypes.addressof(keys),
        values=ctypes.addressof(values),
        count=len(keys),
        map_fd=fd,
    )
    _bpf(MAP_UPDATE_BATCH, attr, f"failed to update {len(keys)} map elements")


def map_delete_batch(fd: int, keys: ctypes.Array[Any]) -> int:
    """Delete the elements of ``keys`` that exist, in one call; return how many went."""
    deleted = 0
    remaining = list(keys)
    key_type = keys._type_
    while remaining:
        array = (key_type * len(remaining))(*remaining)
        attr = _Batch(keys=ctypes.addressof(array), count=len(remaining), map_fd=fd)
        try:
            _bpf(MAP_DELETE_BATCH, attr, f"failed to delete {len(remaining)} map elements")
            return deleted + len(remaining)
        except BPFError as err:
            if err.errno != errno.ENOENT:
                raise
            # The batch stops at the first absent key: skip it and go on.
            deleted += attr.count
            remaining = remaining[attr.count + 1 :]
    return deleted


def map_lookup_batch(
    fd: int,
    key_type: type[CValue],
    value_type: type[CValue],
    chunk: int = 512,
) -> list[tuple[Any, Any]]:
    """Every (key, value) of a hash map, a chunk per system call instead of two calls per
    element: ints for simple types, structures for structures. For a map of maps the
    values are the inner maps' ids."""
    found: list[tuple[Any, Any]] = []
    # The resume token: a bucket number for hash maps, a key for others.
    size = max(8, ctypes.sizeof(key_type))
    token_in, token_out = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
    started = False
    while True:
        keys, values = (key_type * chunk)(), (value_type * chunk)()
        attr = _Batch(
            in_batch=ctypes.addressof(token_in) if started else 0,
            out_batch=ctypes.addressof(token_out),
            keys=ctypes.addressof(keys),
            values=ctypes.addressof(values),
            count=chunk,
            map_fd=fd,
        )
        done = False
        try:
            _bpf(MAP_LOOKUP_BATCH, attr, "failed to read map elements")
        except BPFError as err:
            if err.errno == errno.ENOSPC and attr.count == 0:
                chunk *= 4  # one bucket holds more elements than a chunk
                continue
            if err.errno != errno.ENOENT:
                raise
            done = True  # the last chunk (possibly empty)
        found.extend(zip(keys[: attr.count], values[: attr.count], strict=True))
        if done:
            return found
        ctypes.memmove(token_in, token_out, size)
        started = True


def map_lookup(fd: int, key: ctypes._CData, value: ctypes._CData) -> bool:
    """Fill ``value``; False when the key is absent."""
    try:
        _bpf(MAP_LOOKUP_ELEM, _elem(fd, key, value), "failed to look up map element")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def map_delete(fd: int, key: ctypes._CData) -> bool:
    """False when the key was already absent."""
    try:
        _bpf(MAP_DELETE_ELEM, _elem(fd, key, None), "failed to delete map element")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def map_next_key(fd: int, key: ctypes._CData | None, next_key: ctypes._CData) -> bool:
    """Fill ``next_key`` with the key after ``key`` (None: the first); False at the end."""
    try:
        _bpf(MAP_GET_NEXT_KEY, _elem(fd, key, next_key), "failed to iterate map")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def prog_info(fd: int) -> ProgInfo:
    info = ProgInfo()
    attr = _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(OBJ_GET_INFO_BY_FD, attr, "failed to read program info")
    return info


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    attr = _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(OBJ_GET_INFO_BY_FD, attr, "failed to read map info")
    return info


def map_get_fd_by_id(map_id: int) -> int:
    """An fd for the map with this id (an inner map found through its outer map)."""
    return _bpf(MAP_GET_FD_BY_ID, _GetById(id=map_id), f"failed to open map id {map_id}")


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
    _bpf(PROG_TEST_RUN, attr, "failed to test-run the program")
    retval = ctypes.c_int32(attr.retval).value
    return retval, data_out.raw[: attr.data_size_out], ctx_out, attr.duration


def link_create(prog_fd: int, ifindex: int, attach_type: int) -> int:
    """Attach a program to a device hook with a bpf_link (tcx); the caller pins or closes it."""
    attr = _LinkCreate(prog_fd=prog_fd, target_ifindex=ifindex, attach_type=attach_type)
    return _bpf(LINK_CREATE, attr, f"failed to attach to ifindex {ifindex}")


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


def netfilter_link_create(prog_fd: int, hooknum: int, priority: int) -> int:
    """Attach a netfilter program to an IPv4 hook of the caller's network namespace with
    a bpf_link; the caller pins or closes it. (Such links cannot change program.)"""
    attr = _NetfilterLinkCreate(
        prog_fd=prog_fd, attach_type=NETFILTER, pf=NFPROTO_IPV4, hooknum=hooknum,
        priority=priority,
    )  # fmt: skip
    return _bpf(LINK_CREATE, attr, f"failed to attach to netfilter hook {hooknum}")


def link_update(link_fd: int, prog_fd: int) -> None:
    """Swap the link's program in one step."""
    _bpf(LINK_UPDATE, _LinkUpdate(link_fd=link_fd, new_prog_fd=prog_fd), "failed to update link")


def link_info(fd: int) -> LinkInfo:
    info = LinkInfo()
    attr = _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(OBJ_GET_INFO_BY_FD, attr, "failed to read link info")
    return info


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key."""
    with open("/sys/devices/system/cpu/possible") as f:
        count = 0
        for part in f.read().strip().split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
    return count
