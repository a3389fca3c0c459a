"""The whole cluster with its agent in controller mode (``sluicectl agent --resolver
controller``) and ``sluicectl controller`` running: real pods, real packets.

Under live traffic, a controller restart and an agent restart neither let denied
traffic through nor cut allowed traffic; and Kubernetes' own NetworkPolicy e2e specs
(the subset ``test_kubernetes`` runs in agent mode) pass. A shard the controller did
not write adds nobody (and the controller deletes it); a policy sluice cannot read is
published refused and isolates what it selects (counted at the receiving pod).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cni.kube.api import Api
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    collection_path,
    object_path,
    policy_endpoints_name,
)
from tests.harness.cluster import Cluster
from tests.harness.controller import (
    ControllerMode,
    controller_agent_argv,
    published,
)
from tests.harness.controller import controller_mode as controller_mode_of
from tests.harness.e2e import NETPOL_SUBSET, NETPOL_SUBSET_FOCUS, NETPOL_SUBSET_SKIP, run_netpol
from tests.harness.kube_matrix import KubeMatrix
from tests.harness.waiting import eventually
from tests.node.agent.test_kubernetes import (
    NETEXEC_PORT,
    apply,
    http_get,
    netexec_pod,
    pod_ip,
    wait_ready,
)

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def controller_mode(
    k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerMode]:
    with controller_mode_of(k8s_cluster, tmp_path_factory.mktemp("controllers")) as mode:
        yield mode


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
    tally = run_netpol(controller_mode.cluster, focus=NETPOL_SUBSET_FOCUS, skip=NETPOL_SUBSET_SKIP)
    assert not tally.failed and len(tally.passed) == len(NETPOL_SUBSET), tally.summary()


# -- trust and failing closed, with real packets -------------------------------------------


@pytest.fixture(scope="module")
def matrix(controller_mode: ControllerMode) -> Iterator[KubeMatrix]:
    made = KubeMatrix(controller_mode.cluster)
    try:
        made.add_pods(["x/a", "x/b", "x/c", "y/a"])
        yield made
    finally:
        made.destroy()


def into_x_a_from(matrix: KubeMatrix, *rules: dict[str, Any]) -> dict[str, Any]:
    return matrix.policy(
        "x", "into-a", podSelector={"matchLabels": {"pod": "a"}}, policyTypes=["Ingress"],
        ingress=list(rules),
    )  # fmt: skip


FROM_B = {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}


def reach(matrix: KubeMatrix, source: str, target: str = "x/a") -> tuple[bool, int]:
    """Whether ``source`` reaches ``target`` on TCP 80 (once by address, once through
    the ClusterIP), and how many connections from it arrived at the target meanwhile."""
    before = matrix.received_from(target, source).get(("tcp", 80), 0)
    reached = [matrix.probe([source], [target], 80, "tcp", via)[(source, target)] for via in (0, 1)]
    after = matrix.received_from(target, source).get(("tcp", 80), 0)
    assert len(set(reached)) == 1, f"{source} -> {target}: by address and ClusterIP differ"
    return reached[0], after - before


def test_a_forged_shard_adds_nobody_and_the_controller_deletes_it(
    controller_mode: ControllerMode, matrix: KubeMatrix
) -> None:
    """An AddressSet the controller did not write, carrying a real set's id and shard
    index and x/c's address, shadows nothing: x/c stays out, and the forgery goes."""
    cluster = controller_mode.cluster
    policy = into_x_a_from(matrix, FROM_B)
    matrix.apply(policy)
    api = Api(str(cluster.kubeconfig))
    try:
        # x/b reached x/a before the policy too: x/c refused is what says it took effect.
        eventually(lambda: reach(matrix, "x/c") == (False, 0), "the policy keeps x/c out")
        assert reach(matrix, "x/b") == (True, 2)
        real = eventually(
            lambda: [
                obj
                for (kind, _), obj in published(api).items()
                if kind == ADDRESS_SET
                and any(p["pod"] == f"{matrix.namespace('x')}/b" for p in obj["spec"]["pods"])
            ],
            "the set of x's pods b published",
        )[0]
        forged = {
            "apiVersion": real["apiVersion"],
            "kind": ADDRESS_SET,
            "metadata": {
                "name": f"forged-{uuid.uuid4().hex[:6]}",
                "labels": real["metadata"]["labels"],
            },
            "spec": {
                **real["spec"],
                "pods": [
                    *real["spec"]["pods"],
                    {"pod": f"{matrix.namespace('x')}/c", "ips": [matrix.pods["x/c"].ip]},
                ],
            },
        }
        api.create(collection_path(ADDRESS_SET), forged)
        forged_key = (ADDRESS_SET, forged["metadata"]["name"])
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:  # while it exists, and after
            assert reach(matrix, "x/c") == (False, 0), "the forged shard let x/c in"
        eventually(lambda: forged_key not in published(api), "the controller deletes it")
        assert reach(matrix, "x/b") == (True, 2)
    finally:
        matrix.delete(policy)
        api.close()


def test_a_policy_sluice_cannot_read_is_published_refused_and_isolates(
    controller_mode: ControllerMode, matrix: KubeMatrix
) -> None:
    """Through the controller: the refused rule survives the CRD's schema and allows
    nothing on the node; the readable one still lets x/b in; get policies says so."""
    cluster = controller_mode.cluster
    unreadable = {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["::ffff:10.1.0.0/112"]}}]}
    policy = into_x_a_from(matrix, FROM_B, unreadable)
    matrix.apply(policy)
    api = Api(str(cluster.kubeconfig))
    try:
        name = policy_endpoints_name(matrix.namespace("x"), "into-a")
        body = eventually(lambda: api.get(object_path(POLICY_ENDPOINTS, name)), "published")
        rules = body["spec"]["policy"]["ingress"]
        assert rules[0] == {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}
        assert rules[1]["refused"].startswith("spec.ingress[1].from[0].ipBlock.except[0]")
        eventually(lambda: reach(matrix, "x/c") == (False, 0), "the policy keeps x/c out")
        assert reach(matrix, "x/b") == (True, 2)
        for source in ("x/c", "y/a"):
            assert reach(matrix, source) == (False, 0), source
        found = json.loads(cluster.sluicectl("get", "policies", "-o", "json").stdout)
        (entry,) = [p for p in found["policies"] if p["policy"].endswith("/into-a")]
        assert entry["refused"] and entry["refused"][0].startswith("spec.ingress[1]")
    finally:
        matrix.delete(policy)
        api.close()
