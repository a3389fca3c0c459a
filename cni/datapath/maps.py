"""The pinned maps of one node's datapath, opened by path (no bcc).

Every map lives under the network's ``bpfDir``; the programs and every
process that programs them (the plugin, sluicectl, the agent) share them.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Any

from cni.datapath import bpf
from cni.datapath.structs import (
    DIRECTIONS,
    REASONS,
    Config,
    CTEntry,
    CTKey,
    Endpoint,
    FragKey,
    PolicyKey,
)

MAPS = (
    "endpoints",
    "peers",
    "rules",
    "conntrack",
    "fragments",
    "config",
    "counters",
    "event_budget",
    "events",
)
PROGRAMS = ("from_pod", "to_pod")

DEFAULT_CONFIG = Config(
    ct_tcp_syn=60,
    ct_tcp_established=8000,
    ct_tcp_closing=10,
    ct_udp=60,
    ct_other=60,
    events_per_second=100,
    events_burst=200,
)


class DatapathMissing(Exception):
    """Nothing (or not everything) is pinned under bpfDir."""


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
                self._fds[name] = bpf.obj_get(self.path(name))
            except bpf.BPFError as err:
                raise DatapathMissing(str(err)) from None
        return self._fds[name]

    def is_loaded(self) -> bool:
        return all(os.path.exists(self.path(name)) for name in (*PROGRAMS, *MAPS))

    # -- iteration -------------------------------------------------------------

    def keys(
        self, name: str, key_type: type[ctypes.Structure] | type[ctypes._SimpleCData]
    ) -> Iterator[Any]:
        fd = self.fd(name)
        key = None
        while True:
            next_key = key_type()
            if not bpf.map_next_key(fd, key, next_key):
                return
            yield next_key
            key = next_key

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

    def delete_endpoint(self, ifindex: int) -> None:
        """Remove an endpoint and everything keyed by it."""
        endpoint = self.endpoint(ifindex)
        bpf.map_delete(self.fd("endpoints"), ctypes.c_uint32(ifindex))
        generations = {0}
        if endpoint is not None:
            # The live generation, and the next one in case an install was cut short.
            generations |= {endpoint.policy_gen, (endpoint.policy_gen + 1) & 0xFFFFFFFF}
        for gen in generations:
            for direction in DIRECTIONS:
                self.delete_policy_maps(ifindex, gen, direction)
        self.sweep_flows({ifindex})

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

    # -- conntrack and fragments ------------------------------------------------------

    def flows(self) -> list[tuple[CTKey, CTEntry]]:
        found = []
        for key in self.keys("conntrack", CTKey):
            value = CTEntry()
            if bpf.map_lookup(self.fd("conntrack"), key, value):
                found.append((key, value))
        return found

    def sweep_flows(self, ifindexes: set[int]) -> int:
        """Delete conntrack and fragment entries of these endpoints."""
        removed = 0
        for name, key_type in (("conntrack", CTKey), ("fragments", FragKey)):
            doomed = [k for k in self.keys(name, key_type) if k.ifindex in ifindexes]
            removed += sum(bpf.map_delete(self.fd(name), k) for k in doomed)
        return removed

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
