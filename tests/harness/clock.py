"""A clock for the IPAM's tests and benchmarks: time moves only when told to."""

from __future__ import annotations

from ipam.clock import Instant


class SimulatedClock:
    """Time that moves only when told to (tests and benchmarks)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.wall = start
        self.boot = 100.0
        self.boots = 1

    def now(self) -> Instant:
        return Instant(self.wall, self.boot, f"simulated-{self.boots}")

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.boot += seconds

    def step_wall(self, seconds: float) -> None:
        """The wall clock jumps; time since boot does not."""
        self.wall += seconds

    def reboot(self, downtime: float) -> None:
        self.wall += downtime
        self.boot = 10.0
        self.boots += 1
