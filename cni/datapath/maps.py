"""The pinned maps of one node's datapath, opened by path (no bcc).

Every map lives under the network's ``bpfDir``; the programs and every
process that programs them (the plugin, sluicectl, the agent) share them.
A map is checked when opened: a pinned map whose key or value size is not
this build's (a datapath pinned by an older sluice) is refused with
DatapathMismatch, never used with the wrong sizes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cni.datapath import bpf
from cni.datapath.structs import (
    DIRECTIONS,
    REASONS,
    SVC_CLUSTER_IP,
    Config,
    CTEntry,
    CTKey,
    Endpoint,
    EpStats,
    EventBudget,
    PolicyKey,
    ip_be,
    ip_str,
)

U32 = ctypes.sizeof(ctypes.c_uint32)
# name -> (key size, value size, per-CPU value); the ring buffer has neither.
MAP_LAYOUT = {
    "endpoints": (U32, ctypes.sizeof(Endpoint)),
    "ep_by_ip": (U32, U32),
    "service_ips": (U32, U32),
    "peers": (ctypes.sizeof(PolicyKey), U32),
    "rules": (ctypes.sizeof(PolicyKey), U32),
    "ct_tables": (U32, U32),
    "ep_stats": (U32, ctypes.sizeof(EpStats)),
    "config": (U32, ctypes.sizeof(Config)),
    "counters": (U32, 8),
    "event_budget": (U32, ctypes.sizeof(EventBudget)),
}
MAPS = (*MAP_LAYOUT, "events")
PROGRAMS = ("from_pod", "to_pod", "uplink")


class DatapathMissing(Exception):
    """Nothing (or not everything) is pinned under bpfDir."""


class DatapathMismatch(DatapathMissing):
    """What is pinned under bpfDir was built with other struct layouts."""


@dataclass(frozen=True)
class TableFill:
    """One endpoint's conntrack table: live entries, capacity, and what the datapath
    created and removed since attach (the LRU evicted the rest)."""

    ifindex: int
    entries: int
    capacity: int
    created: int
    removed: int

    @property
    def evicted(self) -> int:
        return max(0, self.created - self.removed - self.entries)


class Datapath:
    """Open pinned maps lazily; close with ``close()`` or ``with``."""

    def __init__(self, bpf_dir: str) -> None:
        self.bpf_dir = bpf_dir
        self._fds: dict[str, int] = {}

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def path(self, name: str) -> str:
        return os.path.join(self.bpf_dir, name)

    def fd(self, name: str) -> int:
        if name not in self._fds:
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
        return self._fds[name]

    def is_loaded(self) -> bool:
        return all(os.path.exists(self.path(name)) for name in (*PROGRAMS, *MAPS))

    # -- iteration -------------------------------------------------------------

    def keys(
        self, name: str, key_type: type[ctypes.Structure] | type[ctypes._SimpleCData]
    ) -> Iterator[Any]:
        yield from iterate(self.fd(name), key_type)

    # -- endpoints --------------------------------------------------------------

    def endpoint(self, ifindex: int) -> Endpoint | None:
        value = Endpoint()
        return (
            value if bpf.map_lookup(self.fd("endpoints"), ctypes.c_uint32(ifindex), value) else None
        )

    def endpoints(self) -> dict[int, Endpoint]:
        found = {}
        for key in self.keys("endpoints", ctypes.c_uint32):
            value = Endpoint()
            if bpf.map_lookup(self.fd("endpoints"), key, value):
                found[key.value] = value
        return found

    def set_endpoint(self, ifindex: int, endpoint: Endpoint) -> None:
        bpf.map_update(self.fd("endpoints"), ctypes.c_uint32(ifindex), endpoint)

    def set_endpoint_ips(self, ifindex: int, ips: Iterable[str]) -> None:
        """Register the pod's addresses as its own (anti-spoofing, Services)."""
        for ip in ips:
            bpf.map_update(
                self.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)), ctypes.c_uint32(ifindex)
            )

    def endpoint_ips(self, ifindex: int | None = None) -> dict[str, int]:
        """{pod address: ifindex}, of one endpoint or of all."""
        found = {}
        for key in self.keys("ep_by_ip", ctypes.c_uint32):
            owner = ctypes.c_uint32()
            if bpf.map_lookup(self.fd("ep_by_ip"), key, owner) and ifindex in (None, owner.value):
                found[ip_str(key.value)] = owner.value
        return found

    def delete_endpoint(self, ifindex: int, table: bool = True) -> None:
        """Remove an endpoint and everything keyed by it: its addresses, policy maps,
        stats and (unless ``table`` is False: ``drop_ct_table`` later) its conntrack
        table (one delete, whatever it holds)."""
        endpoint = self.endpoint(ifindex)
        bpf.map_delete(self.fd("endpoints"), ctypes.c_uint32(ifindex))
        for ip in self.endpoint_ips(ifindex):
            bpf.map_delete(self.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
        generations = {0}
        if endpoint is not None:
            # The live generation, and the next one in case an install was cut short.
            generations |= {endpoint.policy_gen, (endpoint.policy_gen + 1) & 0xFFFFFFFF}
        for gen in generations:
            for direction in DIRECTIONS:
                self.delete_policy_maps(ifindex, gen, direction)
        bpf.map_delete(self.fd("ep_stats"), ctypes.c_uint32(ifindex))
        if table:
            self.drop_ct_table(ifindex)

    def drop_ct_table(self, ifindex: int) -> None:
        """Forget the endpoint's conntrack table (the kernel waits for an RCU grace
        period, then frees it)."""
        bpf.map_delete(self.fd("ct_tables"), ctypes.c_uint32(ifindex))

    # -- policy maps --------------------------------------------------------------

    def delete_policy_maps(self, ifindex: int, gen: int, direction: int) -> None:
        key = PolicyKey(ifindex, gen, direction)
        bpf.map_delete(self.fd("peers"), key)
        bpf.map_delete(self.fd("rules"), key)

    def policy_keys(self) -> set[tuple[int, int, int]]:
        """(ifindex, generation, direction) of every installed policy map."""
        return {
            (k.ifindex, k.gen, k.dir)
            for name in ("peers", "rules")
            for k in self.keys(name, PolicyKey)
        }

    # -- services ---------------------------------------------------------------------

    def set_service_ips(self, ips: Iterable[str]) -> None:
        """Make ``ips`` the set of ClusterIPs. Safe while traffic flows: new addresses
        are added before stale ones go, and one that stays is never absent."""
        wanted = {ip_be(ip) for ip in ips}
        fd = self.fd("service_ips")
        for address in wanted:
            bpf.map_update(fd, ctypes.c_uint32(address), ctypes.c_uint32(SVC_CLUSTER_IP))
        for key in list(self.keys("service_ips", ctypes.c_uint32)):
            if key.value not in wanted:
                bpf.map_delete(fd, key)

    def service_ips(self) -> set[str]:
        return {ip_str(k.value) for k in self.keys("service_ips", ctypes.c_uint32)}

    # -- conntrack ------------------------------------------------------------------------

    def create_ct_table(self, ifindex: int, entries: int | None = None) -> None:
        """A new, empty conntrack table for the endpoint (replacing any it had)."""
        size = entries or self.config().ct_per_endpoint or 4096
        fd = bpf.map_create(
            bpf.MAP_TYPE_LRU_HASH, ctypes.sizeof(CTKey), ctypes.sizeof(CTEntry), size, 0, "sl_ct"
        )
        try:
            bpf.map_update(self.fd("ct_tables"), ctypes.c_uint32(ifindex), ctypes.c_int(fd))
        finally:
            os.close(fd)
        bpf.map_update(self.fd("ep_stats"), ctypes.c_uint32(ifindex), EpStats())

    def ct_tables(self) -> list[int]:
        """ifindexes that have a conntrack table."""
        return [k.value for k in self.keys("ct_tables", ctypes.c_uint32)]

    def open_ct_table(self, ifindex: int) -> int | None:
        """An fd for the endpoint's conntrack table (the caller closes it)."""
        map_id = ctypes.c_uint32()
        if not bpf.map_lookup(self.fd("ct_tables"), ctypes.c_uint32(ifindex), map_id):
            return None
        return bpf.map_get_fd_by_id(map_id.value)

    def flows(self, ifindex: int) -> list[tuple[CTKey, CTEntry]]:
        """The entries of one endpoint's conntrack table (flows and fragments)."""
        fd = self.open_ct_table(ifindex)
        if fd is None:
            return []
        try:
            found = []
            for key in iterate(fd, CTKey):
                value = CTEntry()
                if bpf.map_lookup(fd, key, value):
                    found.append((key, value))
            return found
        finally:
            os.close(fd)

    def sweep_flows(self, ifindexes: Iterable[int]) -> None:
        """Forget every flow of these endpoints: each gets a fresh, empty table."""
        for ifindex in ifindexes:
            fd = self.open_ct_table(ifindex)
            if fd is None:
                continue
            capacity = bpf.map_info(fd).max_entries
            os.close(fd)
            self.create_ct_table(ifindex, capacity)

    def table_fill(self, ifindex: int) -> TableFill | None:
        fd = self.open_ct_table(ifindex)
        if fd is None:
            return None
        try:
            capacity = bpf.map_info(fd).max_entries
            entries = sum(1 for _ in iterate(fd, CTKey))
        finally:
            os.close(fd)
        stats = EpStats()
        bpf.map_lookup(self.fd("ep_stats"), ctypes.c_uint32(ifindex), stats)
        return TableFill(ifindex, entries, capacity, stats.ct_created, stats.ct_removed)

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
        for direction, dir_name in DIRECTIONS.items():
            totals[dir_name] = {}
            for index, reason in enumerate(REASONS):
                values = (ctypes.c_uint64 * cpus)()
                key = ctypes.c_uint32(direction * len(REASONS) + index)
                bpf.map_lookup(self.fd("counters"), key, values)
                totals[dir_name][reason] = sum(values)
        return totals


def iterate(fd: int, key_type: type[ctypes.Structure] | type[ctypes._SimpleCData]) -> Iterator[Any]:
    key = None
    while True:
        next_key = key_type()
        if not bpf.map_next_key(fd, key, next_key):
            return
        yield next_key
        key = next_key
