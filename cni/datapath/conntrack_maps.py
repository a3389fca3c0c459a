"""The endpoints' conntrack: ``ct_tables`` (a map of maps: two LRU tables per slot,
the flows an endpoint opened and those opened toward it; writes cost a grace
period) and the slots' bookkeeping (``ct_free``, ``ct_dirty``: tables handed
back, for the reaper)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from cni.datapath import bpf, rcu
from cni.datapath.structs import CT_INBOUND, CT_SHARES, NONE, CTEntry, CTKey

if TYPE_CHECKING:
    from cni.datapath.maps import Datapath

DEFAULT_CT_ENTRIES = 4096


def ct_key(slot: int, inbound: bool) -> int:
    """The ct_tables key of one share of a slot."""
    return slot | CT_INBOUND if inbound else slot


class TableFill(NamedTuple):
    """One endpoint's conntrack (both shares together): live entries, capacity, and
    what the datapath created and removed since attach (the LRUs evicted the rest)."""

    ifindex: int
    entries: int
    capacity: int
    created: int
    removed: int
    inbound: int = 0  # of the entries, those in the share of flows opened toward it

    @property
    def evicted(self) -> int:
        return max(0, self.created - self.removed - self.entries)


class ConntrackMaps:
    def __init__(self, datapath: Datapath) -> None:
        self.dp = datapath

    def allocate_slots(self, count: int) -> list[int]:
        return self.dp.allocate("next_ct_slot", count)

    def capacity(self) -> int:
        """Entries of each new conntrack table (``conntrackPerEndpoint``)."""
        return self.dp.config().ct_per_endpoint or DEFAULT_CT_ENTRIES

    def insert_tables(self, slots: list[int], entries: int) -> None:
        """Fresh, empty tables of ``entries`` entries in these slots, both shares of each
        (replacing any they had), in one batch: one grace period."""
        keys = [ct_key(slot, inbound) for slot in slots for inbound in CT_SHARES]
        fds: list[int] = []
        try:
            for _ in keys:
                fds.append(
                    bpf.map_create(
                        bpf.MAP_TYPE_LRU_HASH,
                        ctypes.sizeof(CTKey),
                        ctypes.sizeof(CTEntry),
                        entries,
                        0,
                        "sl_ct",
                    )
                )
            self.dp.insert_inner("ct_tables", keys, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def delete_table(self, slot: int) -> bool:
        """Both shares of the slot, in one batch: one grace period if any was there."""
        keys = (ctypes.c_uint32 * 2)(*(ct_key(slot, inbound) for inbound in CT_SHARES))
        deleted = bpf.map_delete_batch(self.dp.fd("ct_tables"), keys)
        rcu.count_waits(int(deleted > 0))
        return deleted > 0

    def slots(self) -> set[int]:
        """The slots that have a table in ct_tables (either share)."""
        return {key & ~CT_INBOUND for key in self.dp.inner_maps("ct_tables")}

    def give_back(self, slot: int) -> None:
        """A table whose endpoint is gone: dirty until the reaper refills or deletes it.
        Should the record be full (nobody reaps), the table is deleted right away."""
        try:
            bpf.map_update(self.dp.fd("ct_dirty"), ctypes.c_uint32(slot), ctypes.c_uint32(0))
        except bpf.BPFError:
            self.delete_table(slot)

    def create_table(self, ifindex: int, entries: int | None = None) -> None:
        """A new, empty conntrack table for the endpoint (replacing any it had; one grace
        period). An endpoint without a slot gets one of its own first."""
        from cni.datapath.maps import DatapathMissing  # the handle's module imports this one

        endpoints = self.dp.endpoints
        with self.dp.lock:
            endpoint = endpoints.get(ifindex)
            if endpoint is None:
                raise DatapathMissing(f"ifindex {ifindex} is not an endpoint")
            if endpoint.ct_slot == NONE:
                endpoint.ct_slot = self.allocate_slots(1)[0]
                endpoints.put(ifindex, endpoint)
        self.insert_tables([endpoint.ct_slot], entries or self.capacity())
        endpoints.reset_stats(ifindex)

    def tables(self) -> list[int]:
        """ifindexes of the endpoints that have a conntrack table."""
        slots = self.slots()
        return [i for i, ep in self.dp.endpoints.all().items() if ep.ct_slot in slots]

    def open_table(self, ifindex: int, inbound: bool = False) -> int | None:
        """An fd for one share of the endpoint's conntrack (the caller closes it):
        the flows it opened, or (``inbound``) the flows opened toward it."""
        endpoint = self.dp.endpoints.get(ifindex)
        map_id = ctypes.c_uint32()
        if endpoint is None or endpoint.ct_slot == NONE:
            return None
        key = ctypes.c_uint32(ct_key(endpoint.ct_slot, inbound))
        if not bpf.map_lookup(self.dp.fd("ct_tables"), key, map_id):
            return None
        return bpf.map_get_fd_by_id(map_id.value)

    def flows(self, ifindex: int, inbound: bool | None = None) -> list[tuple[CTKey, CTEntry]]:
        """The entries (flows and fragments) of one share of the endpoint's conntrack,
        or (None) of both, the outbound share's first."""
        from cni.datapath.maps import iterate

        found = []
        for share in CT_SHARES if inbound is None else (inbound,):
            fd = self.open_table(ifindex, share)
            if fd is None:
                continue
            try:
                for key in iterate(fd, CTKey):
                    value = CTEntry()
                    if bpf.map_lookup(fd, key, value):
                        found.append((key, value))
            finally:
                os.close(fd)
        return found

    def sweep(self, ifindexes: Iterable[int]) -> None:
        """Forget every flow of these endpoints: each gets a fresh, empty table of the
        same size (one batch, so one grace period, per size)."""
        by_size: dict[int, list[int]] = {}
        for ifindex in ifindexes:
            fd = self.open_table(ifindex)
            endpoint = self.dp.endpoints.get(ifindex)
            if fd is None or endpoint is None:
                continue
            by_size.setdefault(bpf.map_info(fd).max_entries, []).append(endpoint.ct_slot)
            os.close(fd)
        for size, slots in by_size.items():
            self.insert_tables(slots, size)

    def fill(self, ifindex: int) -> TableFill | None:
        entries = capacity = inbound_entries = 0
        for inbound in CT_SHARES:
            fd = self.open_table(ifindex, inbound)
            if fd is None:
                return None
            try:
                capacity += bpf.map_info(fd).max_entries
                # A chunk of entries per system call, never two calls per entry.
                found = len(bpf.map_lookup_batch(fd, CTKey, CTEntry, chunk=4096))
            finally:
                os.close(fd)
            entries += found
            inbound_entries += found if inbound else 0
        stats = self.dp.endpoints.stats(ifindex)
        return TableFill(
            ifindex, entries, capacity, stats.ct_created, stats.ct_removed, inbound_entries
        )
