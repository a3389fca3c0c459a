"""``sluicectl controller`` processes for tests: short lease timings, a log file each,
stopped (or killed) by their own pid, and the API state they publish."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cni.kube.api import Api
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    collection_path,
)
from tests.harness.cni_run import SLUICECTL

if TYPE_CHECKING:
    from tests.harness.cluster import Cluster

CRDS = Path(__file__).resolve().parents[2] / "conf" / "policyendpoints.yaml"

# Fast enough for tests, ordered as leader election needs them.
TEST_LEASE = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")


class ControllerProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        identity: str,
        lease_name: str = "sluice-controller-test",
        *extra: str,
    ) -> None:
        self.identity = identity
        self.log_path = log
        self.argv = [
            str(SLUICECTL), "controller", "--kubeconfig", str(kubeconfig),
            "--lease-namespace", "default", "--lease-name", lease_name,
            "--identity", identity, *TEST_LEASE, *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log)
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def messages(self) -> list[str]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").splitlines()
        out = []
        for line in lines:
            try:
                out.append(str(json.loads(line).get("msg", "")))
            except ValueError:
                out.append(line)
        return out

    def said(self, text: str) -> bool:
        return any(text in message for message in self.messages())

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.messages()[-lines:])


def lease_holder(api: Api, name: str = "sluice-controller-test") -> str:
    lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{name}")
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def published(api: Api) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of the three kinds (all cluster-scoped): (kind, name) -> object."""
    found = {}
    for kind in (POLICY_ENDPOINTS, ADDRESS_SET, POLICY_TARGETS):
        for obj in api.list(collection_path(kind)).items:
            found[(kind, obj["metadata"]["name"])] = obj
    return found


def versions(api: Api) -> dict[tuple[str, str], tuple[str, str]]:
    """(uid, resourceVersion) of every published object."""
    return {
        key: (obj["metadata"]["uid"], obj["metadata"]["resourceVersion"])
        for key, obj in published(api).items()
    }


def settled(api: Api, quiet: float = 1.5, timeout: float = 60.0) -> dict:
    """The published objects once nothing has changed for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = versions(api)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = versions(api)
        if now == last:
            return now
        last = now
    raise AssertionError(f"published objects still changing after {timeout:.0f} s")


def controller_agent_argv(cluster: Cluster) -> list[str]:
    from tests.harness.cluster import sluice_agent_argv

    return [*sluice_agent_argv(cluster), "--resolver", "controller"]


@dataclass
class ControllerMode:
    """A cluster whose agent resolves through ``sluicectl controller``'s objects."""

    cluster: Cluster
    logs: Path
    controllers: list[ControllerProcess] = field(default_factory=list)

    def start_controller(self) -> ControllerProcess:
        number = len(self.controllers)
        process = ControllerProcess(
            self.cluster.kubeconfig_for("sluice-controller"),
            self.logs / f"controller-{number}.log",
            f"controller-{number}",
        ).start()
        self.controllers.append(process)
        return process


@contextlib.contextmanager
def controller_mode(cluster: Cluster, logs: Path | None = None) -> Iterator[ControllerMode]:
    """The cluster's agent restarted with ``--resolver controller``, a controller
    running; afterwards the agent resolves on its own again and the CRDs are gone."""
    from tests.harness.cluster import sluice_agent_argv
    from tests.harness.waiting import eventually

    cluster.kubectl("apply", "-f", str(CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRDS))
    with contextlib.ExitStack() as stack:
        if logs is None:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="controllers-")))
        mode = ControllerMode(cluster, logs)
        try:
            first = mode.start_controller()
            eventually(
                lambda: first.said("published") or first.said("term"), "the controller leads"
            )
            cluster.replace_agent(controller_agent_argv(cluster))
            yield mode
        finally:
            cluster.replace_agent(sluice_agent_argv(cluster))
            for process in mode.controllers:
                process.stop()
            cluster.kubectl(
                "delete", "-f", str(CRDS), "--ignore-not-found", "--wait=true", timeout=120
            )
