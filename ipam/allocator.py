"""What both allocation modes share: allocations keyed by attachment, release,
GC, cooldowns, and the store they live in.

An attachment is (container id, ifname) within the store's network. A mode
only decides which address a new attachment gets and when an ADD cannot be
served.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from ipam import logs
from ipam.clock import Clock, Instant
from ipam.config import IPAMConfig
from ipam.errors import NoAddress
from ipam.store import AllocationRow, Store

log = logs.get("sluice.ipam")


class Allocation(NamedTuple):
    ip: ipaddress.IPv4Address
    prefixlen: int
    container_id: str
    ifname: str
    allocated: Instant
    pod_namespace: str = ""
    pod_name: str = ""

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


class Allocator:
    """Base of the two modes; ``_choose`` and ``unavailable_reason`` are theirs."""

    config: IPAMConfig
    prefixlen: int  # the prefix length reported with each address

    def __init__(self, config: IPAMConfig, store: Store, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        store.save_config(config.to_json())

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Allocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _allocation(self, row: AllocationRow) -> Allocation:
        return Allocation(
            ipaddress.IPv4Address(row.ip),
            self.prefixlen,
            row.container_id,
            row.ifname,
            row.allocated,
            row.pod_namespace,
            row.pod_name,
        )

    def allocate(
        self, container_id: str, ifname: str, pod_namespace: str = "", pod_name: str = ""
    ) -> tuple[Allocation, bool]:
        """The attachment's address, allocating one if it has none; True if new."""
        with self.store.transaction():
            existing = self.store.allocation_for(container_id, ifname)
            if existing is not None:
                return self._allocation(existing), False
            now = self.clock.now()
            self._forget_cooled(now)
            address = self._choose()
            row = AllocationRow(str(address), container_id, ifname, now, pod_namespace, pod_name)
            self.store.insert_allocation(row)
            self._after_allocate()
        self._after_commit()
        return self._allocation(row), True

    def _choose(self) -> ipaddress.IPv4Address:
        """The mode's choice of a free address (inside the write transaction)."""
        raise NotImplementedError

    def _forget_cooled(self, now: Instant) -> None:
        """Drop addresses whose cooldown is over from the cooling list."""
        self.store.forget_cooled(now, self.config.cooldown_seconds)

    def _longest_cooled(
        self, usable: Callable[[ipaddress.IPv4Address], bool], none_left: str
    ) -> ipaddress.IPv4Address:
        """The usable cooling address released longest ago, when nothing else is left."""
        taken = {row.ip for row in self.store.allocations()}
        now = self.clock.now()
        cooling = [
            (now.since(released), ip)
            for ip, released in self.store.cooling().items()
            if ip not in taken and usable(ipaddress.IPv4Address(ip))
        ]
        if not cooling:
            raise NoAddress(none_left)
        age, ip = max(cooling)
        log.warning(
            "only cooling addresses are left in network %s: reusing %s, released %.0f s ago",
            self.config.network,
            ip,
            age,
        )
        return ipaddress.IPv4Address(ip)

    def _after_allocate(self) -> None:
        """Hook inside the write transaction that allocated an address."""

    def unavailable_reason(self) -> str | None:
        """Why an ADD could not get an address now, or None if it could."""
        raise NotImplementedError

    def find(self, container_id: str, ifname: str) -> Allocation | None:
        row = self.store.allocation_for(container_id, ifname)
        return self._allocation(row) if row else None

    def allocations(self) -> list[Allocation]:
        return [self._allocation(row) for row in self.store.allocations()]

    def cooling(self) -> dict[str, Instant]:
        """Released addresses still cooling down, with the instant of their release."""
        now = self.clock.now()
        return {
            ip: released
            for ip, released in self.store.cooling().items()
            if now.since(released) < self.config.cooldown_seconds
        }

    @contextmanager
    def changing(self) -> Iterator[None]:
        """A write transaction that may release addresses, with the mode's bookkeeping."""
        with self.store.transaction():
            yield
            self._after_change()
        self._after_commit()

    def release_rows(self, rows: list[AllocationRow]) -> None:
        """Release these allocations (inside ``changing``)."""
        now = self.clock.now()
        for row in rows:
            self.store.release(row, now)

    def release(self, container_id: str, ifname: str) -> Allocation | None:
        with self.changing():
            row = self.store.allocation_for(container_id, ifname)
            self.release_rows([row] if row else [])
        return self._allocation(row) if row else None

    def gc(self, valid: set[tuple[str, str]]) -> list[Allocation]:
        """Release every allocation whose (container id, ifname) is not in ``valid``."""
        with self.changing():
            stale = [
                row
                for row in self.store.allocations()
                if (row.container_id, row.ifname) not in valid
            ]
            self.release_rows(stale)
        return [self._allocation(row) for row in stale]

    def _after_change(self) -> None:
        """Hook inside the write transaction that released addresses."""

    def _after_commit(self) -> None:
        """Hook after that transaction committed."""
