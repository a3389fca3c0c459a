"""What the datapath knows of the cluster's network: the Services' ClusterIPs
(``service_ips``), which node holds which pod range (``pod_ranges``, an LPM trie)
and the tunnel's peers (``tunnel_peers``). Each set is written whole, new
entries before stale ones go, so it is safe while traffic flows."""

from __future__ import annotations

import ctypes
import ipaddress
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from cni.datapath import bpf
from cni.datapath.structs import SVC_CLUSTER_IP, PeerKey, PodRange, ip_be, ip_str

if TYPE_CHECKING:
    from cni.datapath.maps import Datapath


class PodRangeHolder(NamedTuple):
    """Who holds a pod range: a node's InternalIP (None for this node's own ranges and
    for ranges no known node holds), and the entry's flags (RANGE_*)."""

    node: str | None
    flags: int = 0


class NetworkMaps:
    def __init__(self, datapath: Datapath) -> None:
        self.dp = datapath

    def set_service_ips(self, ips: Iterable[str]) -> None:
        """Make ``ips`` the set of ClusterIPs."""
        self._set_addresses("service_ips", ips, SVC_CLUSTER_IP)

    def service_ips(self) -> set[str]:
        return {ip_str(k.value) for k in self.dp.keys("service_ips", ctypes.c_uint32)}

    def set_pod_ranges(self, ranges: Mapping[ipaddress.IPv4Network, PodRangeHolder]) -> None:
        """Make ``pod_ranges`` exactly ``ranges``."""
        fd = self.dp.fd("pod_ranges")
        for network, holder in ranges.items():
            node = ip_be(holder.node) if holder.node else 0
            bpf.map_update(fd, _range_key(network), PodRange(node, holder.flags))
        for network in set(self.pod_ranges()) - set(ranges):
            bpf.map_delete(fd, _range_key(network))

    def pod_ranges(self) -> dict[ipaddress.IPv4Network, PodRangeHolder]:
        from cni.datapath.maps import iterate

        fd = self.dp.fd("pod_ranges")  # an LPM trie has no batch lookup: key by key
        found = {}
        for key in list(iterate(fd, PeerKey)):
            value = PodRange()
            if bpf.map_lookup(fd, key, value):
                network = ipaddress.IPv4Network(f"{ip_str(key.addr)}/{key.prefixlen}")
                node = ip_str(value.node) if value.node else None
                found[network] = PodRangeHolder(node, value.flags)
        return found

    def set_tunnel_peers(self, addresses: Iterable[str]) -> None:
        """Make ``tunnel_peers`` exactly ``addresses``."""
        self._set_addresses("tunnel_peers", addresses, 1)

    def tunnel_peers(self) -> set[str]:
        return {ip_str(k.value) for k in self.dp.keys("tunnel_peers", ctypes.c_uint32)}

    def _set_addresses(self, name: str, addresses: Iterable[str], value: int) -> None:
        wanted = {ip_be(ip) for ip in addresses}
        fd = self.dp.fd(name)
        for address in wanted:
            bpf.map_update(fd, ctypes.c_uint32(address), ctypes.c_uint32(value))
        for key in list(self.dp.keys(name, ctypes.c_uint32)):
            if key.value not in wanted:
                bpf.map_delete(fd, key)


def _range_key(network: ipaddress.IPv4Network) -> PeerKey:
    return PeerKey(network.prefixlen, ip_be(network.network_address))
