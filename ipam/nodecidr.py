"""Node-CIDR allocation: addresses from one subnet (the node's podCIDR).

The lowest address that is neither allocated nor cooling is handed out.
Released addresses cool down for ``cooldownSeconds`` before reuse, so a
late packet or conntrack entry of a deleted pod never reaches its successor;
when only cooling addresses are left, the one released longest ago is taken.
"""

from __future__ import annotations

import ipaddress
from _socket import inet_aton
from collections.abc import Iterator

from ipam.allocator import Allocator
from ipam.clock import Clock
from ipam.config import NodeCIDRConfig
from ipam.store import Store


def ip_int(address: str) -> int:
    """A dotted-quad address the store wrote as an integer (about ten times faster than
    through ``ipaddress``, which matters with thousands of cooling addresses)."""
    return int.from_bytes(inet_aton(address), "big")


class NodeCIDRAllocator(Allocator):
    config: NodeCIDRConfig

    def __init__(self, config: NodeCIDRConfig, store: Store, clock: Clock) -> None:
        super().__init__(config, store, clock)
        self.prefixlen = config.subnet.prefixlen

    def candidates(self) -> Iterator[ipaddress.IPv4Address]:
        """Every address the range hands out, lowest first."""
        gateway = self.config.gateway
        for value in range(int(self.config.range_start), int(self.config.range_end) + 1):
            address = ipaddress.IPv4Address(value)
            if address != gateway:
                yield address

    def _choose(self) -> ipaddress.IPv4Address:
        # The lowest gap among the busy addresses, in integers: the cost grows with the
        # pods and the cooling addresses, not with the range (a /16 has 65,534).
        start, end = int(self.config.range_start), int(self.config.range_end)
        busy = {ip_int(ip) for ip in self.store.allocated_ips()}
        busy.update(ip_int(ip) for ip in self.store.cooling_ips())
        gateway = self.config.gateway
        if gateway is not None:
            busy.add(int(gateway))
        lowest = start
        for value in sorted(busy):
            if value > lowest:
                break
            if value == lowest:
                lowest += 1
        if lowest <= end:
            return ipaddress.IPv4Address(lowest)
        return self._longest_cooled(self.in_range, self._exhausted())

    def _exhausted(self) -> str:
        return (
            f"no address left in {self.config.subnet} (range {self.config.range_start}-"
            f"{self.config.range_end}): all {self.config.size} are allocated"
        )

    def in_range(self, address: ipaddress.IPv4Address) -> bool:
        return (
            self.config.range_start <= address <= self.config.range_end
            and address != self.config.gateway
        )

    def available(self) -> int:
        """Addresses an ADD could get now, cooling ones included (they are reused last)."""
        taken = sum(
            1 for row in self.store.allocations() if self.in_range(ipaddress.IPv4Address(row.ip))
        )
        return self.config.size - taken

    def unavailable_reason(self) -> str | None:
        return None if self.available() > 0 else self._exhausted()
