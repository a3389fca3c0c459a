"""A datapath in memory: the ``PolicyWriter`` (``cni.datapath.interfaces``) that the
enforcer writes into when there is no kernel.

It keeps what a node's pinned maps would hold for the enforcer (each endpoint's
live policy and its generation, the Services' addresses), which outlives an
enforcer as the pinned maps outlive an agent, and the order of every write. It
fails as the kernel's datapath can: one endpoint's write refused with a
PolicyError while the rest of the batch is installed (``reject_next``), or an
OSError partway through a batch (``crash_next``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cni.policy.vocabulary import EndpointPolicy, PolicyError


@dataclass(frozen=True)
class Install:
    at: float  # time.monotonic()
    ifindex: int
    policy: EndpointPolicy
    generation: int


@dataclass(frozen=True)
class Refusal:
    at: float  # time.monotonic()
    ifindex: int
    error: Exception


class FakeDatapath:
    """Endpoints' policies and the Services' addresses, in memory; thread-safe."""

    def __init__(self) -> None:
        self.installs: list[Install] = []  # every endpoint write, in order
        self.refusals: list[Refusal] = []  # every write it failed, in order
        self.current: dict[int, EndpointPolicy] = {}  # ifindex -> live policy
        self.generations: dict[int, int] = {}
        self.service_addresses: frozenset[str] = frozenset()
        self.service_writes = 0
        self.changed = threading.Condition()  # notified after every write
        self._rejects: dict[int, PolicyError] = {}
        self._crash: tuple[int, OSError] | None = None
        self._service_failure: OSError | None = None

    # -- failures to come ----------------------------------------------------------------

    def reject_next(self, ifindexes: Iterable[int], error: PolicyError | None = None) -> None:
        """Refuse the next write of each of these endpoints with ``error``, as
        ``install_many`` refuses a rule set that does not compile."""
        with self.changed:
            for ifindex in ifindexes:
                self._rejects[ifindex] = error or PolicyError(f"ifindex {ifindex}: refused")

    def crash_next(self, after: int = 0, error: OSError | None = None) -> None:
        """Make the next ``install_many`` write the first ``after`` endpoints of its
        batch and then raise ``error`` (the rest refused), as a map write the kernel
        refuses does."""
        with self.changed:
            self._crash = (after, error or OSError(28, "No space left on device"))

    def fail_service_write_next(self, error: OSError | None = None) -> None:
        """Make the next ``set_service_addresses`` raise ``error`` and write nothing."""
        with self.changed:
            self._service_failure = error or OSError(1, "Operation not permitted")

    # -- the PolicyWriter ----------------------------------------------------------------

    def install_many(
        self, wanted: Mapping[int, EndpointPolicy], failed: dict[int, PolicyError]
    ) -> dict[int, int]:
        with self.changed:
            batch = list(wanted.items())
            crash, self._crash = self._crash, None
            written = batch if crash is None else batch[: crash[0]]
            generations: dict[int, int] = {}
            for ifindex, policy in written:
                rejected = self._rejects.pop(ifindex, None)
                if rejected is not None:
                    failed[ifindex] = rejected
                    self._refuse(ifindex, rejected)
                else:
                    generations[ifindex] = self._write(ifindex, policy)
            self.changed.notify_all()
            if crash is not None:
                for ifindex, _ in batch[len(written) :]:
                    self._refuse(ifindex, crash[1])
                raise crash[1]
            return generations

    def set_service_addresses(self, addresses: Iterable[str]) -> None:
        with self.changed:
            failure, self._service_failure = self._service_failure, None
            if failure is not None:
                raise failure
            self.service_addresses = frozenset(addresses)
            self.service_writes += 1
            self.changed.notify_all()

    # -- reading it ----------------------------------------------------------------------

    def wait_for(self, condition: Callable[[FakeDatapath], bool], timeout: float = 10.0) -> bool:
        """Whether ``condition(self)`` came true within ``timeout`` seconds."""
        with self.changed:
            return self.changed.wait_for(lambda: condition(self), timeout)

    def installs_of(self, ifindex: int) -> list[Install]:
        with self.changed:
            return [install for install in self.installs if install.ifindex == ifindex]

    # -- internals -----------------------------------------------------------------------

    def _write(self, ifindex: int, policy: EndpointPolicy) -> int:
        """One endpoint's entry: a new generation when its policy changes, as in the
        kernel's entry (rewriting the same policy leaves it as it is)."""
        generation = self.generations.get(ifindex, 0)
        if self.current.get(ifindex) != policy:
            generation += 1
        self.current[ifindex] = policy
        self.generations[ifindex] = generation
        self.installs.append(Install(time.monotonic(), ifindex, policy, generation))
        return generation

    def _refuse(self, ifindex: int, error: Exception) -> None:
        self.refusals.append(Refusal(time.monotonic(), ifindex, error))
