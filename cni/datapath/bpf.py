"""The bpf(2) system call through ctypes: the call itself, pins and maps.

The CNI path uses only these modules, never bcc: getting a pinned object's fd
costs about 0.1 ms, importing bcc tens of milliseconds and compiling a
second or more. Programs' info and test runs are in ``cni.datapath.bpf_programs``,
links in ``cni.datapath.bpf_links``.
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
MAP_GET_FD_BY_ID = 14
OBJ_GET_INFO_BY_FD = 15
MAP_LOOKUP_BATCH = 24
MAP_UPDATE_BATCH = 26
MAP_DELETE_BATCH = 27

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


def syscall(cmd: int, attr: ctypes.Structure, what: str) -> int:
    """bpf(cmd, attr): its return value, or BPFError saying ``what`` failed."""
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
    return syscall(OBJ_GET, attr, f'failed to open pinned object "{path}"')


def obj_pin(fd: int, path: str) -> None:
    name = path.encode()
    attr = _ObjPin(
        pathname=ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value or 0, bpf_fd=fd
    )
    syscall(OBJ_PIN, attr, f'failed to pin "{path}"')


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
    return syscall(MAP_CREATE, attr, f"failed to create map {name!r}")


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
    syscall(MAP_UPDATE_ELEM, _elem(fd, key, value, flags), "failed to update map element")


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
    syscall(MAP_UPDATE_BATCH, attr, f"failed to update {len(keys)} map elements")


def map_delete_batch(fd: int, keys: ctypes.Array[Any]) -> int:
    """Delete the elements of ``keys`` that exist, in one call; return how many went."""
    deleted = 0
    remaining = list(keys)
    key_type = keys._type_
    while remaining:
        array = (key_type * len(remaining))(*remaining)
        attr = _Batch(keys=ctypes.addressof(array), count=len(remaining), map_fd=fd)
        try:
            syscall(MAP_DELETE_BATCH, attr, f"failed to delete {len(remaining)} map elements")
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
            syscall(MAP_LOOKUP_BATCH, attr, "failed to read map elements")
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
        syscall(MAP_LOOKUP_ELEM, _elem(fd, key, value), "failed to look up map element")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def map_delete(fd: int, key: ctypes._CData) -> bool:
    """False when the key was already absent."""
    try:
        syscall(MAP_DELETE_ELEM, _elem(fd, key, None), "failed to delete map element")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def map_next_key(fd: int, key: ctypes._CData | None, next_key: ctypes._CData) -> bool:
    """Fill ``next_key`` with the key after ``key`` (None: the first); False at the end."""
    try:
        syscall(MAP_GET_NEXT_KEY, _elem(fd, key, next_key), "failed to iterate map")
    except BPFError as err:
        if err.errno == errno.ENOENT:
            return False
        raise
    return True


def obj_info(fd: int, info: ctypes.Structure, what: str) -> None:
    """Fill ``info`` (a leading part of a struct bpf_*_info) for the object behind ``fd``."""
    attr = _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    syscall(OBJ_GET_INFO_BY_FD, attr, what)


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    obj_info(fd, info, "failed to read map info")
    return info


def map_get_fd_by_id(map_id: int) -> int:
    """An fd for the map with this id (an inner map found through its outer map)."""
    return syscall(MAP_GET_FD_BY_ID, _GetById(id=map_id), f"failed to open map id {map_id}")


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key."""
    with open("/sys/devices/system/cpu/possible") as f:
        count = 0
        for part in f.read().strip().split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
    return count
