"""Time for allocations and cooldowns, immune to wall-clock steps.

An instant records the wall clock (the only clock that spans reboots, shown to
people) together with the time since boot and the boot's id. The time between
two instants of the same boot comes from CLOCK_BOOTTIME, so stepping the wall
clock (NTP, an operator, a VM resume) neither ends a cooldown early nor makes
a fresh allocation look old; across a reboot only the wall clock can tell.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Protocol

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class Instant(NamedTuple):
    wall: float  # seconds since the epoch
    boot: float  # seconds since boot (CLOCK_BOOTTIME)
    boot_id: str

    def since(self, earlier: Instant) -> float:
        """Seconds from ``earlier`` to this instant."""
        if earlier.boot_id and earlier.boot_id == self.boot_id:
            return self.boot - earlier.boot
        return self.wall - earlier.wall


class Clock(Protocol):
    def now(self) -> Instant: ...


class SystemClock:
    def __init__(self) -> None:
        with open(BOOT_ID_PATH) as f:
            self.boot_id = f.read().strip()

    def now(self) -> Instant:
        return Instant(time.time(), time.clock_gettime(time.CLOCK_BOOTTIME), self.boot_id)
