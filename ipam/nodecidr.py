"""Node-CIDR allocation: addresses from one subnet (the node's podCIDR).

The lowest address that is neither allocated nor cooling is handed out.
Released addresses cool down for ``cooldownSeconds`` before reuse, so a
late packet or conntrack entry of a deleted pod never reaches its successor;
when only cooling addresses are left, the one released longest ago is taken.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from cni.errors import ERR_NO_ADDRESS, CNIError
from ipam.config import NodeCIDRConfig
from ipam.store import AllocationRow, Store, store_path

log = logging.getLogger("sluice.ipam")


@dataclass(frozen=True)
class Allocation:
    ip: ipaddress.IPv4Address
    prefixlen: int
    container_id: str
    ifname: str
    allocated_at: float

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


class NodeCIDRAllocator:
    def __init__(self, config: NodeCIDRConfig, store: Store) -> None:
        self.config = config
        self.store = store

    @classmethod
    def open(cls, config: NodeCIDRConfig) -> NodeCIDRAllocator:
        return cls(config, Store(store_path(config.state_dir, config.network), config.network))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> NodeCIDRAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _allocation(self, row: AllocationRow) -> Allocation:
        return Allocation(
            ipaddress.IPv4Address(row.ip),
            self.config.subnet.prefixlen,
            row.container_id,
            row.ifname,
            row.allocated_at,
        )

    def _candidates(self) -> Iterable[ipaddress.IPv4Address]:
        gateway = self.config.gateway
        for value in range(int(self.config.range_start), int(self.config.range_end) + 1):
            address = ipaddress.IPv4Address(value)
            if address != gateway:
                yield address

    def allocate(
        self, container_id: str, ifname: str, pod_namespace: str = "", pod_name: str = ""
    ) -> tuple[Allocation, bool]:
        """The attachment's address, allocating one if it has none; True if new."""
        with self.store.transaction():
            existing = self.store.allocation_for(container_id, ifname)
            if existing is not None:
                return self._allocation(existing), False
            now = time.time()
            self.store.forget_cooled(now - self.config.cooldown_seconds)
            taken = {row.ip for row in self.store.allocations()}
            cooling = self.store.cooling()
            chosen = next(
                (a for a in self._candidates() if str(a) not in taken and str(a) not in cooling),
                None,
            )
            if chosen is None:
                chosen = self._longest_cooled(cooling, taken)
            row = AllocationRow(str(chosen), container_id, ifname, now, pod_namespace, pod_name)
            self.store.insert_allocation(row)
        return self._allocation(row), True

    def _longest_cooled(self, cooling: dict[str, float], taken: set[str]) -> ipaddress.IPv4Address:
        in_range = [
            (released, ip)
            for ip, released in cooling.items()
            if ip not in taken and self._in_range(ipaddress.IPv4Address(ip))
        ]
        if not in_range:
            raise CNIError(
                ERR_NO_ADDRESS,
                f"no address left in {self.config.subnet} "
                f"(range {self.config.range_start}-{self.config.range_end}): "
                f"all {self.config.size} are allocated",
            )
        released, ip = min(in_range)
        log.warning(
            "only cooling addresses are left in %s: reusing %s, released %.0f s ago",
            self.config.subnet,
            ip,
            time.time() - released,
        )
        return ipaddress.IPv4Address(ip)

    def _in_range(self, address: ipaddress.IPv4Address) -> bool:
        return (
            self.config.range_start <= address <= self.config.range_end
            and address != self.config.gateway
        )

    def find(self, container_id: str, ifname: str) -> Allocation | None:
        row = self.store.allocation_for(container_id, ifname)
        return self._allocation(row) if row else None

    def release(self, container_id: str, ifname: str) -> Allocation | None:
        with self.store.transaction():
            row = self.store.allocation_for(container_id, ifname)
            if row is not None:
                self.store.release(row, time.time())
        return self._allocation(row) if row else None

    def gc(self, valid: set[tuple[str, str]]) -> list[Allocation]:
        """Release every allocation whose (container id, ifname) is not in ``valid``."""
        with self.store.transaction():
            stale = [
                row
                for row in self.store.allocations()
                if (row.container_id, row.ifname) not in valid
            ]
            now = time.time()
            for row in stale:
                self.store.release(row, now)
        return [self._allocation(row) for row in stale]

    def allocations(self) -> list[Allocation]:
        return [self._allocation(row) for row in self.store.allocations()]

    def available(self) -> int:
        """Addresses an ADD could get now, cooling ones included (they are reused last)."""
        taken = sum(
            1 for row in self.store.allocations() if self._in_range(ipaddress.IPv4Address(row.ip))
        )
        return self.config.size - taken
