"""The endpoints' maps: each pod's entry by its node-side veth's ifindex
(``endpoints``), the addresses it owns (``ep_by_ip``: anti-spoofing and
Services), and its conntrack statistics (``ep_stats``)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cni.datapath import bpf
from cni.datapath.structs import DIRECTIONS, NONE, Endpoint, EpStats, ip_be, ip_str

if TYPE_CHECKING:
    from cni.datapath.maps import Datapath


class EndpointMaps:
    def __init__(self, datapath: Datapath) -> None:
        self.dp = datapath

    def get(self, ifindex: int) -> Endpoint | None:
        value = Endpoint()
        found = bpf.map_lookup(self.dp.fd("endpoints"), ctypes.c_uint32(ifindex), value)
        return value if found else None

    def all(self) -> dict[int, Endpoint]:
        found = bpf.map_lookup_batch(self.dp.fd("endpoints"), ctypes.c_uint32, Endpoint)
        return dict(found)

    def put(self, ifindex: int, endpoint: Endpoint) -> None:
        bpf.map_update(self.dp.fd("endpoints"), ctypes.c_uint32(ifindex), endpoint)

    def add_ips(self, ifindex: int, ips: Iterable[str]) -> None:
        """Register the pod's addresses as its own (anti-spoofing, Services)."""
        for ip in ips:
            bpf.map_update(
                self.dp.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)), ctypes.c_uint32(ifindex)
            )

    def ips(self, ifindex: int | None = None) -> dict[str, int]:
        """{pod address: ifindex}, of one endpoint or of all."""
        found = bpf.map_lookup_batch(self.dp.fd("ep_by_ip"), ctypes.c_uint32, ctypes.c_uint32)
        return {ip_str(key): owner for key, owner in found if ifindex in (None, owner)}

    def owner_of(self, ip: str) -> int | None:
        """The ifindex that registered ``ip`` as its own, if one did."""
        owner = ctypes.c_uint32()
        found = bpf.map_lookup(self.dp.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)), owner)
        return owner.value if found else None

    def reset_stats(self, ifindex: int) -> None:
        bpf.map_update(self.dp.fd("ep_stats"), ctypes.c_uint32(ifindex), EpStats())

    def stats(self, ifindex: int) -> EpStats:
        value = EpStats()
        bpf.map_lookup(self.dp.fd("ep_stats"), ctypes.c_uint32(ifindex), value)
        return value

    def delete(self, ifindex: int, ips: Iterable[str] | None = None) -> Endpoint | None:
        """Remove an endpoint and everything keyed by it (its entry, addresses and
        stats); return the entry it had. Its conntrack table is given back (dirty) and
        its policy references are released: no map of maps is written, so no grace
        period is waited for; the reaper deletes or refills what nobody uses.

        ``ips``: the endpoint's addresses as the caller knows them (DEL: the node's
        routes to it), each removed if it is still this endpoint's; then only the
        entry's own address is looked up besides, not every endpoint's (a DEL's cost
        stays the same however many pods the node has). An address the caller did
        not know stays until GC's sweep. None: every address found in the map."""
        with self.dp.lock:
            endpoint = self.get(ifindex)
            bpf.map_delete(self.dp.fd("endpoints"), ctypes.c_uint32(ifindex))
            if ips is None:
                owned = list(self.ips(ifindex))
            else:
                owned = [*ips, *([ip_str(endpoint.ip)] if endpoint is not None else [])]
            for ip in dict.fromkeys(owned):
                if self.owner_of(ip) == ifindex:
                    bpf.map_delete(self.dp.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
            bpf.map_delete(self.dp.fd("ep_stats"), ctypes.c_uint32(ifindex))
            if endpoint is not None:
                self.release(endpoint)
            return endpoint

    def release(self, endpoint: Endpoint) -> None:
        """What an endpoint entry that is gone or overwritten held: its conntrack table
        goes back as dirty (refilled before it is handed out again), its policy ids
        lose a reference. Call with the state lock held."""
        if endpoint.ct_slot != NONE:
            self.dp.conntrack.give_back(endpoint.ct_slot)
        policies = sum(1 for d in DIRECTIONS if endpoint.policy(d) != NONE)
        self.dp.count_releases(tables=int(endpoint.ct_slot != NONE), policies=policies)
