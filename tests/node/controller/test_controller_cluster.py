"""The whole cluster with its agent in controller mode (``sluicectl agent --resolver
controller``) and ``sluicectl controller`` running: real pods, real packets.

Under live traffic, a controller restart and an agent restart neither let denied
traffic through nor cut allowed traffic; and Kubernetes' own NetworkPolicy e2e specs
(the subset ``test_kubernetes`` runs in agent mode) pass.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.cluster import Cluster, sluice_agent_argv
from tests.harness.controller import ControllerProcess
from tests.harness.e2e import NETPOL_SKIP, run_netpol
from tests.harness.waiting import eventually
from tests.node.agent.test_kubernetes import (
    E2E_SUBSET,
    NETEXEC_PORT,
    apply,
    http_get,
    netexec_pod,
    pod_ip,
    wait_ready,
)

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CRDS = Path(__file__).resolve().parents[3] / "conf" / "policyendpoints.yaml"


def controller_agent_argv(cluster: Cluster) -> list[str]:
    return [*sluice_agent_argv(cluster), "--resolver", "controller"]


@dataclass
class ControllerMode:
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


@pytest.fixture(scope="module")
def controller_mode(
    k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerMode]:
    """The cluster's agent restarted with ``--resolver controller``, a controller
    running; afterwards the agent resolves on its own again and the CRDs are gone."""
    cluster = k8s_cluster
    cluster.kubectl("apply", "-f", str(CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRDS))
    mode = ControllerMode(cluster, tmp_path_factory.mktemp("controllers"))
    try:
        first = mode.start_controller()
        eventually(lambda: first.said("published") or first.said("term"), "the controller leads")
        cluster.replace_agent(controller_agent_argv(cluster))
        yield mode
    finally:
        cluster.replace_agent(sluice_agent_argv(cluster))
        for process in mode.controllers:
            process.stop()
        cluster.kubectl("delete", "-f", str(CRDS), "--ignore-not-found", "--wait=true", timeout=120)


def server_policy(namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "server-from-good", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {"app": "server"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "good"}}}],
                    "ports": [{"port": NETEXEC_PORT, "protocol": "TCP"}],
                }
            ],
        },
    }


@dataclass
class Probes:
    """Connections from a client pod to the server, made by the client's netexec."""

    client_ip: str
    server_ip: str
    results: list[tuple[float, bool]] = field(default_factory=list)

    def once(self) -> bool:
        query = urllib.parse.urlencode(
            {
                "request": "hostname",
                "protocol": "http",
                "host": self.server_ip,
                "port": NETEXEC_PORT,
                "tries": 1,
            }
        )
        try:
            dialed = json.loads(
                http_get(f"http://{self.client_ip}:{NETEXEC_PORT}/dial?{query}", timeout=8)
            )
        except OSError:
            return False
        return dialed.get("responses") == ["server"]

    def run(self, stopping: threading.Event, interval: float = 0.2) -> None:
        while not stopping.is_set():
            self.results.append((time.monotonic(), self.once()))
            stopping.wait(interval)


def test_restarts_under_live_traffic_let_nothing_denied_through_and_cut_nothing_allowed(
    controller_mode: ControllerMode, k8s_namespace: str
) -> None:
    cluster, namespace = controller_mode.cluster, k8s_namespace
    apply(
        cluster,
        namespace,
        server_policy(namespace),
        netexec_pod("server"),
        netexec_pod("good"),
        netexec_pod("bad"),
    )
    wait_ready(cluster, namespace, "server", "good", "bad")
    server = pod_ip(cluster, namespace, "server")
    good = Probes(pod_ip(cluster, namespace, "good"), server)
    bad = Probes(pod_ip(cluster, namespace, "bad"), server)
    # The server's pod was admitted with its policy in place: denied from its first packet.
    assert not bad.once(), "a denied client reached the server"
    eventually(good.once, "the allowed client reaches the server")

    stopping = threading.Event()
    threads = [threading.Thread(target=p.run, args=(stopping,), daemon=True) for p in (good, bad)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        # The controller restarts: the new one starts with empty caches.
        old = controller_mode.controllers[-1]
        old.stop()
        new = controller_mode.start_controller()
        eventually(lambda: new.said("term"), "the new controller leads and plans")
        time.sleep(5)
        # The agent restarts: its pinned datapath enforces while it is away.
        cluster.replace_agent(controller_agent_argv(cluster))
        time.sleep(8)
    finally:
        stopping.set()
        for thread in threads:
            thread.join(timeout=30)
    let_through = [t for t, ok in bad.results if ok]
    cut = [t for t, ok in good.results if not ok]
    # A denied probe waits out its dial's timeout (about 5 s): three span the restarts.
    assert len(good.results) > 20 and len(bad.results) >= 3, (good.results, bad.results)
    assert not let_through, f"{len(let_through)} denied connections passed"
    assert not cut, f"{len(cut)} of {len(good.results)} allowed connections failed"
    # The new controller found everything as it would have written it.
    assert not [m for m in new.messages() if "published" in m and "deleted" in m]


def test_networkpolicy_e2e_subset_with_the_controller(controller_mode: ControllerMode) -> None:
    focus = (
        r"\[sig-network\] Netpol NetworkPolicy between server and client ("
        + "|".join(re.escape(spec) for spec in E2E_SUBSET)
        + ")"
    )
    tally = run_netpol(
        controller_mode.cluster, focus=focus, skip=rf"{NETPOL_SKIP}|using UDP|using SCTP"
    )
    assert not tally.failed and len(tally.passed) == len(E2E_SUBSET), tally.summary()
