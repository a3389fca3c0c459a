"""The bpf(2) system call through ctypes: maps, pins and object info.

The CNI path uses only this module, never bcc: getting a pinned object's fd
costs about 0.1 ms, importing bcc tens of milliseconds and compiling a
second or more.
"""

from __future__ import annotations

import ctypes
import errno
import os

SYS_BPF = {"x86_64": 321, "aarch64": 280}[os.uname().machine]

# Commands (include/uapi/linux/bpf.h).
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
OBJ_PIN = 6
OBJ_GET = 7
OBJ_GET_INFO_BY_FD = 15
LINK_CREATE = 28
LINK_UPDATE = 29

# tcx attach points (kernel 6.6 and later): no qdisc, several programs per hook.
TCX_INGRESS = 46
TCX_EGRESS = 47

# Map types and flags used here.
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
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


def link_create(prog_fd: int, ifindex: int, attach_type: int) -> int:
    """Attach a program to a device hook with a bpf_link (tcx); the caller pins or closes it."""
    attr = _LinkCreate(prog_fd=prog_fd, target_ifindex=ifindex, attach_type=attach_type)
    return _bpf(LINK_CREATE, attr, f"failed to attach to ifindex {ifindex}")


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
