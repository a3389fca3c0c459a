"""The pinned maps of one node's datapath, opened by path (no bcc).

Every map lives under the network's ``bpfDir``; the programs and every
process that programs them (the plugin, sluicectl, the agent) share them.
An open ``Datapath`` is the handle to one of them: it owns the maps' file
descriptors, the state lock (``datapath.lock``: cni.datapath.lock) and, in a
long-lived process, the reaper thread that cleans up after it
(``datapath.reaper``: cni.datapath.reaper). A process opens one per bpfDir and
passes it to whatever works on that datapath.
A map is checked when opened: a pinned map whose key or value size is not
this build's (a datapath pinned by an older sluice) is refused with
DatapathMismatch, never used with the wrong sizes.

Writes to the maps of maps (``peers``, ``rules``, ``ct_tables``) each cost
an RCU grace period (``cni.datapath.rcu``): they are made here, in batches
where they can be, and counted.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from cni.datapath import bpf, rcu
from cni.datapath.lock import StateLock
from cni.datapath.structs import (
    COUNTED_DIRECTIONS,
    CT_INBOUND,
    CT_SHARES,
    DIRECTIONS,
    NONE,
    REASONS,
    SVC_CLUSTER_IP,
    Config,
    CTEntry,
    CTKey,
    Endpoint,
    EpStats,
    EventBudget,
    Ledger,
    PeerKey,
    PodRange,
    PolicyDigest,
    ip_be,
    ip_str,
)

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
DEFAULT_CT_ENTRIES = 4096
MAPS = (*MAP_LAYOUT, "events")
PROGRAMS = ("from_pod", "to_pod", "uplink", "from_network")
# Netfilter programs (kernel 6.4 and later, with BTF): pinned when the kernel takes them.
NF_PROGRAMS = ("after_nat",)


class PodRangeHolder(NamedTuple):
    """Who holds a pod range: a node's InternalIP (None for this node's own ranges and
    for ranges no known node holds), and the entry's flags (RANGE_*)."""

    node: str | None
    flags: int = 0


class DatapathMissing(Exception):
    """Nothing (or not everything) is pinned under bpfDir."""


class DatapathMismatch(DatapathMissing):
    """What is pinned under bpfDir was built with other struct layouts."""


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

    # -- endpoints --------------------------------------------------------------

    def endpoint(self, ifindex: int) -> Endpoint | None:
        value = Endpoint()
        return (
            value if bpf.map_lookup(self.fd("endpoints"), ctypes.c_uint32(ifindex), value) else None
        )

    def endpoints(self) -> dict[int, Endpoint]:
        found = bpf.map_lookup_batch(self.fd("endpoints"), ctypes.c_uint32, Endpoint)
        return dict(found)

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
        found = bpf.map_lookup_batch(self.fd("ep_by_ip"), ctypes.c_uint32, ctypes.c_uint32)
        return {ip_str(key): owner for key, owner in found if ifindex in (None, owner)}

    def endpoint_of(self, ip: str) -> int | None:
        """The ifindex that registered ``ip`` as its own, if one did."""
        owner = ctypes.c_uint32()
        found = bpf.map_lookup(self.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)), owner)
        return owner.value if found else None

    def reset_stats(self, ifindex: int) -> None:
        bpf.map_update(self.fd("ep_stats"), ctypes.c_uint32(ifindex), EpStats())

    def delete_endpoint(self, ifindex: int, ips: Iterable[str] | None = None) -> Endpoint | None:
        """Remove an endpoint and everything keyed by it (its entry, addresses and
        stats); return the entry it had. Its conntrack table is given back (dirty) and
        its policy references are released: no map of maps is written, so no grace
        period is waited for; the reaper deletes or refills what nobody uses.

        ``ips``: the endpoint's addresses as the caller knows them (DEL: the node's
        routes to it), each removed if it is still this endpoint's; then only the
        entry's own address is looked up besides, not every endpoint's (a DEL's cost
        stays the same however many pods the node has). An address the caller did
        not know stays until GC's sweep. None: every address found in the map."""
        with self.lock:
            endpoint = self.endpoint(ifindex)
            bpf.map_delete(self.fd("endpoints"), ctypes.c_uint32(ifindex))
            if ips is None:
                owned = list(self.endpoint_ips(ifindex))
            else:
                owned = [*ips, *([ip_str(endpoint.ip)] if endpoint is not None else [])]
            for ip in dict.fromkeys(owned):
                if self.endpoint_of(ip) == ifindex:
                    bpf.map_delete(self.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
            bpf.map_delete(self.fd("ep_stats"), ctypes.c_uint32(ifindex))
            if endpoint is not None:
                self.release(endpoint)
            return endpoint

    def release(self, endpoint: Endpoint) -> None:
        """What an endpoint entry that is gone or overwritten held: its conntrack table
        goes back as dirty (refilled before it is handed out again), its policy ids
        lose a reference. Call with the state lock held."""
        if endpoint.ct_slot != NONE:
            self.give_back_table(endpoint.ct_slot)
        policies = sum(1 for d in DIRECTIONS if endpoint.policy(d) != NONE)
        self.count_releases(tables=int(endpoint.ct_slot != NONE), policies=policies)

    # -- the ledger: id counters and release counts --------------------------------------

    def ledger(self) -> Ledger:
        value = Ledger()
        bpf.map_lookup(self.fd("ledger"), ctypes.c_uint32(0), value)
        return value

    def _allocate(self, counter: str, count: int) -> list[int]:
        """``count`` ids of a ledger counter that no writer has ever used (0 means none)."""
        with self.lock:
            value = self.ledger()
            first = max(1, getattr(value, counter))
            setattr(value, counter, first + count)
            bpf.map_update(self.fd("ledger"), ctypes.c_uint32(0), value)
        return list(range(first, first + count))

    def allocate_policy_ids(self, count: int) -> list[int]:
        return self._allocate("next_policy_id", count)

    def allocate_ct_slots(self, count: int) -> list[int]:
        return self._allocate("next_ct_slot", count)

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

    def _insert_inner(self, outer: str, keys: list[int], fds: list[int]) -> None:
        """Point ``outer[key]`` at each new inner map in one batch: one grace period."""
        if not keys:
            return
        bpf.map_update_batch(
            self.fd(outer), (ctypes.c_uint32 * len(keys))(*keys), (ctypes.c_int * len(fds))(*fds)
        )
        rcu.count_waits()

    def _delete_inner(self, outer: str, key: int) -> bool:
        """One grace period if the key was there, none if it was not."""
        deleted = bpf.map_delete(self.fd(outer), ctypes.c_uint32(key))
        rcu.count_waits(int(deleted))
        return deleted

    def inner_maps(self, outer: str) -> dict[int, int]:
        """{key: inner map id} of a map of maps."""
        found = bpf.map_lookup_batch(self.fd(outer), ctypes.c_uint32, ctypes.c_uint32)
        return dict(found)

    # -- policy maps --------------------------------------------------------------------

    def insert_policies(self, ids: list[int], peer_fds: list[int], rule_fds: list[int]) -> None:
        """Make ``peers[id]`` and ``rules[id]`` the given inner maps: two grace periods,
        whatever the number of ids."""
        self._insert_inner("peers", ids, peer_fds)
        self._insert_inner("rules", ids, rule_fds)

    def delete_policy(self, policy_id: int) -> None:
        self._delete_inner("peers", policy_id)
        self._delete_inner("rules", policy_id)

    def policy_ids(self) -> set[int]:
        """Every policy id that has a peer or a rule map."""
        return set(self.inner_maps("peers")) | set(self.inner_maps("rules"))

    def policy_index(self) -> dict[bytes, int]:
        """{rule set digest: policy id}."""
        found = bpf.map_lookup_batch(self.fd("policy_index"), PolicyDigest, ctypes.c_uint32)
        return {bytes(key.bytes): policy_id for key, policy_id in found}

    def find_policy(self, digest: bytes) -> int | None:
        value = ctypes.c_uint32()
        found = bpf.map_lookup(self.fd("policy_index"), _digest(digest), value)
        return value.value if found else None

    def index_policy(self, digest: bytes, policy_id: int) -> None:
        bpf.map_update(self.fd("policy_index"), _digest(digest), ctypes.c_uint32(policy_id))

    def unindex_policy(self, digest: bytes) -> None:
        bpf.map_delete(self.fd("policy_index"), _digest(digest))

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

    # -- the node network: who holds which pod range, the tunnel's peers -----------------

    def set_pod_ranges(self, ranges: Mapping[ipaddress.IPv4Network, PodRangeHolder]) -> None:
        """Make ``pod_ranges`` exactly ``ranges``. Safe while traffic flows: new and
        changed entries are written before stale ones go."""
        fd = self.fd("pod_ranges")
        for network, holder in ranges.items():
            node = ip_be(holder.node) if holder.node else 0
            bpf.map_update(fd, _range_key(network), PodRange(node, holder.flags))
        for network in set(self.pod_ranges()) - set(ranges):
            bpf.map_delete(fd, _range_key(network))

    def pod_ranges(self) -> dict[ipaddress.IPv4Network, PodRangeHolder]:
        fd = self.fd("pod_ranges")  # an LPM trie has no batch lookup: key by key
        found = {}
        for key in list(iterate(fd, PeerKey)):
            value = PodRange()
            if bpf.map_lookup(fd, key, value):
                network = ipaddress.IPv4Network(f"{ip_str(key.addr)}/{key.prefixlen}")
                node = ip_str(value.node) if value.node else None
                found[network] = PodRangeHolder(node, value.flags)
        return found

    def set_tunnel_peers(self, addresses: Iterable[str]) -> None:
        """Make ``tunnel_peers`` exactly ``addresses`` (new ones first)."""
        wanted = {ip_be(ip) for ip in addresses}
        fd = self.fd("tunnel_peers")
        for address in wanted:
            bpf.map_update(fd, ctypes.c_uint32(address), ctypes.c_uint32(1))
        for key in list(self.keys("tunnel_peers", ctypes.c_uint32)):
            if key.value not in wanted:
                bpf.map_delete(fd, key)

    def tunnel_peers(self) -> set[str]:
        return {ip_str(k.value) for k in self.keys("tunnel_peers", ctypes.c_uint32)}

    # -- conntrack ------------------------------------------------------------------------

    def ct_capacity(self) -> int:
        """Entries of each new conntrack table (``conntrackPerEndpoint``)."""
        return self.config().ct_per_endpoint or DEFAULT_CT_ENTRIES

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
            self._insert_inner("ct_tables", keys, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def delete_table(self, slot: int) -> bool:
        """Both shares of the slot, in one batch: one grace period if any was there."""
        keys = (ctypes.c_uint32 * 2)(*(ct_key(slot, inbound) for inbound in CT_SHARES))
        deleted = bpf.map_delete_batch(self.fd("ct_tables"), keys)
        rcu.count_waits(int(deleted > 0))
        return deleted > 0

    def ct_slots(self) -> set[int]:
        """The slots that have a table in ct_tables (either share)."""
        return {key & ~CT_INBOUND for key in self.inner_maps("ct_tables")}

    def give_back_table(self, slot: int) -> None:
        """A table whose endpoint is gone: dirty until the reaper refills or deletes it.
        Should the record be full (nobody reaps), the table is deleted right away."""
        try:
            bpf.map_update(self.fd("ct_dirty"), ctypes.c_uint32(slot), ctypes.c_uint32(0))
        except bpf.BPFError:
            self.delete_table(slot)

    def create_ct_table(self, ifindex: int, entries: int | None = None) -> None:
        """A new, empty conntrack table for the endpoint (replacing any it had; one grace
        period). An endpoint without a slot gets one of its own first."""
        with self.lock:
            endpoint = self.endpoint(ifindex)
            if endpoint is None:
                raise DatapathMissing(f"ifindex {ifindex} is not an endpoint")
            if endpoint.ct_slot == NONE:
                endpoint.ct_slot = self.allocate_ct_slots(1)[0]
                self.set_endpoint(ifindex, endpoint)
        self.insert_tables([endpoint.ct_slot], entries or self.ct_capacity())
        self.reset_stats(ifindex)

    def ct_tables(self) -> list[int]:
        """ifindexes of the endpoints that have a conntrack table."""
        slots = self.ct_slots()
        return [i for i, ep in self.endpoints().items() if ep.ct_slot in slots]

    def open_ct_table(self, ifindex: int, inbound: bool = False) -> int | None:
        """An fd for one share of the endpoint's conntrack (the caller closes it):
        the flows it opened, or (``inbound``) the flows opened toward it."""
        endpoint = self.endpoint(ifindex)
        map_id = ctypes.c_uint32()
        if endpoint is None or endpoint.ct_slot == NONE:
            return None
        key = ctypes.c_uint32(ct_key(endpoint.ct_slot, inbound))
        if not bpf.map_lookup(self.fd("ct_tables"), key, map_id):
            return None
        return bpf.map_get_fd_by_id(map_id.value)

    def flows(self, ifindex: int, inbound: bool | None = None) -> list[tuple[CTKey, CTEntry]]:
        """The entries (flows and fragments) of one share of the endpoint's conntrack,
        or (None) of both, the outbound share's first."""
        found = []
        for share in CT_SHARES if inbound is None else (inbound,):
            fd = self.open_ct_table(ifindex, share)
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

    def sweep_flows(self, ifindexes: Iterable[int]) -> None:
        """Forget every flow of these endpoints: each gets a fresh, empty table of the
        same size (one batch, so one grace period, per size)."""
        by_size: dict[int, list[int]] = {}
        for ifindex in ifindexes:
            fd = self.open_ct_table(ifindex)
            endpoint = self.endpoint(ifindex)
            if fd is None or endpoint is None:
                continue
            by_size.setdefault(bpf.map_info(fd).max_entries, []).append(endpoint.ct_slot)
            os.close(fd)
        for size, slots in by_size.items():
            self.insert_tables(slots, size)

    def table_fill(self, ifindex: int) -> TableFill | None:
        entries = capacity = inbound_entries = 0
        for inbound in CT_SHARES:
            fd = self.open_ct_table(ifindex, inbound)
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
        stats = EpStats()
        bpf.map_lookup(self.fd("ep_stats"), ctypes.c_uint32(ifindex), stats)
        return TableFill(
            ifindex, entries, capacity, stats.ct_created, stats.ct_removed, inbound_entries
        )

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


def _range_key(network: ipaddress.IPv4Network) -> PeerKey:
    return PeerKey(network.prefixlen, ip_be(network.network_address))


def _digest(digest: bytes) -> PolicyDigest:
    key = PolicyDigest()
    ctypes.memmove(key.bytes, digest, len(key.bytes))
    return key


def iterate(fd: int, key_type: type[bpf.CValue]) -> Iterator[Any]:
    key = None
    while True:
        next_key = key_type()
        if not bpf.map_next_key(fd, key, next_key):
            return
        yield next_key
        key = next_key
