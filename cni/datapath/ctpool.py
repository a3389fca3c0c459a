"""The pool of empty conntrack tables: attach takes one, detach gives it back.

Inserting a table into ``ct_tables`` makes the kernel wait for an RCU grace
period (8 to 16 ms), so tables are inserted ahead of time, many in one batch
(one wait), by the reaper (``cni.datapath.reaper``), and listed in
``ct_free`` (slot -> entries). Attaching an endpoint takes a free table of
the configured size: a few plain map operations, no wait. When there is
none (no agent keeps the pool stocked), the endpoint gets a new slot and
inserts its own table: one wait, outside the state lock, as before the pool.

A table given back (``ct_dirty``) may still hold its endpoint's flows, and a
packet in flight may still write to it: the reaper waits for a grace
period, then replaces it with an empty one before it is free again.

Every slot is in one state: named by an endpoint entry (in use), a key of
``ct_free`` (free), a key of ``ct_dirty`` (dirty). A slot in ``ct_tables``
in none of these states is a leftover of a writer that died midway; a full
reap finds it. Slot 0 is "no table".
"""

from __future__ import annotations

import ctypes

from cni.datapath import bpf
from cni.datapath.maps import Datapath


def take(datapath: Datapath, entries: int) -> int | None:
    """A free table of ``entries`` entries, no longer free; None when there is none.
    Call with the state lock held. Free tables of another size (the setting changed)
    are given back, for the reaper to replace."""
    fd = datapath.fd("ct_free")
    while True:
        slot, size = ctypes.c_uint32(), ctypes.c_uint32()
        if not bpf.map_next_key(fd, None, slot):
            return None
        found = bpf.map_lookup(fd, slot, size)
        bpf.map_delete(fd, slot)
        if found and size.value == entries:
            return slot.value
        datapath.conntrack.give_back(slot.value)
        datapath.count_releases(tables=1)


def free_tables(datapath: Datapath) -> dict[int, int]:
    """{slot: entries} of the free tables."""
    found = bpf.map_lookup_batch(datapath.fd("ct_free"), ctypes.c_uint32, ctypes.c_uint32)
    return dict(found)


def dirty_tables(datapath: Datapath) -> set[int]:
    found = bpf.map_lookup_batch(datapath.fd("ct_dirty"), ctypes.c_uint32, ctypes.c_uint32)
    return {slot for slot, _ in found}


def mark_free(datapath: Datapath, slots: list[int], entries: int) -> None:
    """These slots hold empty tables of ``entries`` entries: hand them out. Call with the
    state lock held."""
    for slot in slots:
        bpf.map_update(datapath.fd("ct_free"), ctypes.c_uint32(slot), ctypes.c_uint32(entries))
        bpf.map_delete(datapath.fd("ct_dirty"), ctypes.c_uint32(slot))


def unmark(datapath: Datapath, slots: list[int]) -> None:
    """These slots are neither free nor dirty any more (their tables are deleted)."""
    for slot in slots:
        bpf.map_delete(datapath.fd("ct_free"), ctypes.c_uint32(slot))
        bpf.map_delete(datapath.fd("ct_dirty"), ctypes.c_uint32(slot))
