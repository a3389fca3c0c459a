"""The pinned maps of one node's datapath, opened by path (no bcc).

Every map lives under the network's ``bpfDir``; the programs and every
process that programs them (the plugin, sluicectl, the agent) share them.
An open ``Datapath`` is the handle to one of them: it owns the maps' file
descriptors, the state lock (``datapath.lock``: cni.datapath.lock) and, in a
long-lived process, the reaper thread that cleans up after it
(``datapath.reaper``: cni.datapath.reaper). A process opens one per bpfDir and
passes it to whatever works on that datapath.
Its maps come in families, each a small class on the handle:
``datapath.endpoints`` (``EndpointMaps``), ``datapath.policies``
(``PolicyMaps``), ``datapath.conntrack`` (``ConntrackMaps``) and
``datapath.network`` (``NetworkMaps``: Services, pod ranges, tunnel peers);
the handle itself keeps the ledger, the config and the counters.
A map is checked when opened: a pinned map whose key or value size is not
this build's (a datapath pinned by an older sluice) is refused with
DatapathMismatch, never used with the wrong sizes.

Writes to the maps of maps (``peers``, ``rules``, ``ct_tables``) each cost
an RCU grace period (``cni.datapath.rcu``): they are made here, in batches
where they can be, and counted.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from cni.datapath import bpf, rcu
from cni.datapath.conntrack_maps import DEFAULT_CT_ENTRIES, ConntrackMaps, TableFill, ct_key
from cni.datapath.endpoint_maps import EndpointMaps
from cni.datapath.lock import StateLock
from cni.datapath.network_maps import NetworkMaps, PodRangeHolder
from cni.datapath.policy_maps import PolicyMaps
from cni.datapath.structs import (
    COUNTED_DIRECTIONS,
    REASONS,
    Config,
    Endpoint,
    EpStats,
    EventBudget,
    Ledger,
    PeerKey,
    PodRange,
    PolicyDigest,
)

__all__ = [
    "DEFAULT_CT_ENTRIES",
    "MAPS",
    "PROGRAMS",
    "Datapath",
    "DatapathMismatch",
    "DatapathMissing",
    "PodRangeHolder",
    "TableFill",
    "ct_key",
    "iterate",
]

U32 = ctypes.sizeof(ctypes.c_uint32)
# name -> (key size, value size); the ring buffer has neither.
MAP_LAYOUT = {
    "endpoints": (U32, ctypes.sizeof(Endpoint)),
    "ep_by_ip": (U32, U32),
    "service_ips": (U32, U32),
    "peers": (U32, U32),
    "rules": (U32, U32),
    "ct_tables": (U32, U32),
    "ep_stats": (U32, ctypes.sizeof(EpStats)),
    "config": (U32, ctypes.sizeof(Config)),
    "counters": (U32, 8),
    "event_budget": (U32, ctypes.sizeof(EventBudget)),
    "policy_index": (ctypes.sizeof(PolicyDigest), U32),
    "ct_free": (U32, U32),
    "ct_dirty": (U32, U32),
    "ledger": (U32, ctypes.sizeof(Ledger)),
    "pod_ranges": (ctypes.sizeof(PeerKey), ctypes.sizeof(PodRange)),
    "tunnel_peers": (U32, U32),
}
MAPS = (*MAP_LAYOUT, "events")
PROGRAMS = ("from_pod", "to_pod", "uplink", "from_network")
# Netfilter programs (kernel 6.4 and later, with BTF): pinned when the kernel takes them.
NF_PROGRAMS = ("after_nat",)


class DatapathMissing(Exception):
    """Nothing (or not everything) is pinned under bpfDir."""


class DatapathMismatch(DatapathMissing):
    """What is pinned under bpfDir was built with other struct layouts."""


class Kickable(Protocol):
    """A reaper thread, as the writers that wake it see it."""

    def kick(self, full: bool = False) -> None: ...


class Datapath:
    """The datapath pinned under ``bpf_dir``: its maps (opened lazily, shared by the
    process's threads), its state lock, and the reaper thread of this process if it
    runs one. Close with ``close()`` or ``with``."""

    def __init__(self, bpf_dir: str) -> None:
        self.bpf_dir = bpf_dir
        self.lock = StateLock(bpf_dir)
        self.reaper: Kickable | None = None  # set by the Reaper thread while it runs
        self._fds: dict[str, int] = {}
        self._opening = threading.Lock()
        self.endpoints = EndpointMaps(self)
        self.policies = PolicyMaps(self)
        self.conntrack = ConntrackMaps(self)
        self.network = NetworkMaps(self)

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._opening:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def path(self, name: str) -> str:
        return os.path.join(self.bpf_dir, name)

    def fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is not None:
            return fd
        with self._opening:
            if name in self._fds:
                return self._fds[name]
            try:
                fd = bpf.obj_get(self.path(name))
            except bpf.BPFError as err:
                raise DatapathMissing(str(err)) from None
            expected = MAP_LAYOUT.get(name)
            if expected is not None:
                info = bpf.map_info(fd)
                if (info.key_size, info.value_size) != expected:
                    os.close(fd)
                    raise DatapathMismatch(
                        f'the map "{self.path(name)}" has key/value sizes '
                        f"{info.key_size}/{info.value_size}, this sluice expects "
                        f"{expected[0]}/{expected[1]}: it was pinned by another build "
                        "(sluicectl datapath load --replace)"
                    )
            self._fds[name] = fd
            return fd

    def is_loaded(self) -> bool:
        return all(os.path.exists(self.path(name)) for name in (*PROGRAMS, *MAPS))

    # -- iteration -------------------------------------------------------------

    def keys(self, name: str, key_type: type[bpf.CValue]) -> Iterator[Any]:
        yield from iterate(self.fd(name), key_type)

    # -- the ledger: id counters and release counts --------------------------------------

    def ledger(self) -> Ledger:
        value = Ledger()
        bpf.map_lookup(self.fd("ledger"), ctypes.c_uint32(0), value)
        return value

    def allocate(self, counter: str, count: int) -> list[int]:
        """``count`` ids of a ledger counter that no writer has ever used (0 means none)."""
        with self.lock:
            value = self.ledger()
            first = max(1, getattr(value, counter))
            setattr(value, counter, first + count)
            bpf.map_update(self.fd("ledger"), ctypes.c_uint32(0), value)
        return list(range(first, first + count))

    def count_releases(self, tables: int = 0, policies: int = 0) -> None:
        if not (tables or policies):
            return
        with self.lock:
            value = self.ledger()
            value.released_tables += tables
            value.released_policies += policies
            bpf.map_update(self.fd("ledger"), ctypes.c_uint32(0), value)

    def reset_releases(self) -> None:
        with self.lock:
            value = self.ledger()
            value.released_tables = value.released_policies = 0
            bpf.map_update(self.fd("ledger"), ctypes.c_uint32(0), value)

    # -- maps of maps: every write costs a grace period ------------------------------------

    def insert_inner(self, outer: str, keys: list[int], fds: list[int]) -> None:
        """Point ``outer[key]`` at each new inner map in one batch: one grace period."""
        if not keys:
            return
        bpf.map_update_batch(
            self.fd(outer), (ctypes.c_uint32 * len(keys))(*keys), (ctypes.c_int * len(fds))(*fds)
        )
        rcu.count_waits()

    def delete_inner(self, outer: str, key: int) -> bool:
        """One grace period if the key was there, none if it was not."""
        deleted = bpf.map_delete(self.fd(outer), ctypes.c_uint32(key))
        rcu.count_waits(int(deleted))
        return deleted

    def inner_maps(self, outer: str) -> dict[int, int]:
        """{key: inner map id} of a map of maps."""
        found = bpf.map_lookup_batch(self.fd(outer), ctypes.c_uint32, ctypes.c_uint32)
        return dict(found)

    # -- config and counters --------------------------------------------------------------

    def config(self) -> Config:
        value = Config()
        bpf.map_lookup(self.fd("config"), ctypes.c_uint32(0), value)
        return value

    def set_config(self, **fields: int) -> Config:
        value = self.config()
        for name, setting in fields.items():
            setattr(value, name, setting)
        bpf.map_update(self.fd("config"), ctypes.c_uint32(0), value)
        return value

    def counters(self) -> dict[str, dict[str, int]]:
        """{direction: {reason: packets}}, summed over CPUs."""
        cpus = bpf.possible_cpus()
        totals: dict[str, dict[str, int]] = {}
        for direction, dir_name in COUNTED_DIRECTIONS.items():
            totals[dir_name] = {}
            for index, reason in enumerate(REASONS):
                values = (ctypes.c_uint64 * cpus)()
                key = ctypes.c_uint32(direction * len(REASONS) + index)
                bpf.map_lookup(self.fd("counters"), key, values)
                totals[dir_name][reason] = sum(values)
        return totals


def iterate(fd: int, key_type: type[bpf.CValue]) -> Iterator[Any]:
    key = None
    while True:
        next_key = key_type()
        if not bpf.map_next_key(fd, key, next_key):
            return
        yield next_key
        key = next_key
