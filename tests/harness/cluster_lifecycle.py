"""What the single-node ``Cluster`` and ``MultiNodeCluster`` share around ``up`` and
``down``: a state file in the cluster's directory, rewritten before every step of
``up``; an ``up`` that is undone when it fails; waits that fail early, with the
logs' tails, when one of the cluster's daemons exited.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

from tests.harness.cache import K8sCache
from tests.harness.cluster_state import ClusterError, read_state, write_state
from tests.harness.processes import wait_until


class Recorded(Protocol):
    def to_json(self) -> dict[str, Any]: ...


State = TypeVar("State", bound=Recorded)


class ClusterLifecycle(Generic[State]):
    """A base of the test clusters; ``with cluster:`` brings one up and down."""

    name: str
    directory: Path
    cache: K8sCache
    _state: State | None

    # --- what a cluster fills in ------------------------------------------------------

    def _parse_state(self, data: dict[str, Any]) -> State:
        raise NotImplementedError

    def _check_host(self) -> None:
        """Refuse to start what cannot come up here (before anything starts)."""

    def _up(self) -> None:
        raise NotImplementedError

    def down(self) -> list[str]:
        raise NotImplementedError

    def log_tails(self, lines: int = 20) -> str:
        raise NotImplementedError

    def _assert_running(self) -> None:
        raise NotImplementedError

    # --- state ------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def state(self) -> State:
        if self._state is None:
            self._state = self._load_state()
            if self._state is None:
                raise ClusterError(f"cluster {self.name} is not up (no {self.state_file})")
        return self._state

    def is_up(self) -> bool:
        return self.state_file.exists()

    def _save_state(self) -> None:
        write_state(self.state_file, self.state.to_json())

    def _load_state(self) -> State | None:
        return read_state(self.state_file, self._parse_state)

    # --- up and down ------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        leftovers = self.down()
        if leftovers and exc is None:
            raise ClusterError(f"cluster {self.name} left behind: {leftovers}")

    def up(self) -> None:
        """Start everything and wait until it serves; on failure, undo it all."""
        if self.state_file.exists():
            raise ClusterError(
                f"cluster {self.name} already has state in {self.state_file}: it is up, or an "
                f"earlier up crashed; run `python -m tests.harness down --name {self.name}` first"
            )
        missing = self.cache.missing()
        if missing:
            raise ClusterError(
                f"the Kubernetes cache {self.cache.root} lacks {', '.join(p.name for p in missing)}"
                ": run `make k8s-build` (python -m tests.harness build)"
            )
        self._check_host()
        try:
            self._up()
        except BaseException:
            print(f"cluster {self.name} failed to come up:\n{self.log_tails()}", file=sys.stderr)
            with contextlib.suppress(Exception):
                self.down()
            raise

    def _log(self, message: str) -> None:
        print(f"[k8s {self.name}] {message}", file=sys.stderr, flush=True)

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        def check() -> bool:
            self._assert_running()
            return condition()

        wait_until(check, timeout=timeout, what=what, details=lambda: self.log_tails(15))
