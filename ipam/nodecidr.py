"""Node-CIDR allocation: addresses from one subnet (the node's podCIDR).

The lowest address that is neither allocated nor cooling is handed out.
Released addresses cool down for ``cooldownSeconds`` before reuse, so a
late packet or conntrack entry of a deleted pod never reaches its successor;
when only cooling addresses are left, the one released longest ago is taken.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from ipam.allocator import Allocator
from ipam.clock import Clock
from ipam.config import NodeCIDRConfig
from ipam.store import Store


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
        taken = {row.ip for row in self.store.allocations()}
        cooling = self.store.cooling()
        chosen = next(
            (a for a in self.candidates() if str(a) not in taken and str(a) not in cooling),
            None,
        )
        if chosen is not None:
            return chosen
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
