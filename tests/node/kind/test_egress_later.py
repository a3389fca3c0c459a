"""Egress holds toward pods that appear later, on a kind cluster running sluice.

The three sequences of tests/node/agent/test_kubernetes_policy.py, on the cluster
of ``make kind`` (sluice deployed from conf/, native routing between the node
containers): x/a on the first worker has an egress policy allowing only TCP 80 to
pods a and b of namespaces y and z (plus DNS), the destinations spread over the
other two nodes. A pod created later, a namespace created later and a destination
relabelled out and back are judged right, by pod address and through the
ClusterIP, now and 45 s later; what is denied never arrives at the receiver.

Marker ``kind``: ``make kind-e2e`` runs it, ``make test`` deselects it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.harness import dockerd
from tests.harness.daemonset import DeployedCluster
from tests.harness.kind_matrix import KindKubectl, KindMatrix
from tests.harness.kube_matrix import applied_policies
from tests.harness.waiting import eventually
from tests.node.agent.test_kubernetes_policy import (
    NOTHING,
    TCP_80,
    egress_tcp_80_to_a_and_b_in_y_and_z,
    holds,
    verdicts,
)

pytestmark = [pytest.mark.kind, pytest.mark.docker, pytest.mark.slow]

# The report's wrong verdicts lasted at least 45 s.
LASTING = 45.0
# Node of each pod (1: the first worker, 2: the second, 3: the control plane): the
# source on one, every destination on the others.
PLACEMENT = {"x/a": 1, "x/b": 2, "x/c": 3, "y/a": 2, "y/b": 3, "y/c": 2, "z/a": 3, "z/b": 2,
             "z/c": 3, "x/d": 2, "w/a": 3, "w/b": 2}  # fmt: skip


@pytest.fixture(scope="module")
def matrix(cluster: DeployedCluster) -> Iterator[KindMatrix]:
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    control = "node-role.kubernetes.io/control-plane"
    workers = sorted(n["metadata"]["name"] for n in nodes if control not in n["metadata"]["labels"])
    planes = sorted(n["metadata"]["name"] for n in nodes if control in n["metadata"]["labels"])
    assert len(workers) >= 2 and planes, f"{cluster.name}: workers {workers}, planes {planes}"
    by_index = {1: workers[0], 2: workers[1], 3: planes[0]}
    client = dockerd.ensure().client()
    made = KindMatrix(cluster=KindKubectl(cluster.name), docker=client)
    made.placement = {key: by_index[index] for key, index in PLACEMENT.items()}
    try:
        made.add_pods([f"{ns}/{pod}" for ns in ("x", "y", "z") for pod in ("a", "b", "c")])
        yield made
    finally:
        made.destroy()
        client.close()


@pytest.fixture
def policies(matrix: KindMatrix) -> Iterator[Callable[..., None]]:
    with applied_policies(matrix) as apply:
        yield apply


def in_force(matrix: KindMatrix, target: str) -> None:
    eventually(lambda: not verdicts(matrix, "x/a", target, TCP_80), "the policy in force", 60)


def test_on_kind_egress_holds_towards_a_pod_created_later(
    matrix: KindMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    in_force(matrix, "y/a")
    matrix.add_pods(["x/d"])
    try:
        holds(matrix, "x/d", NOTHING, for_seconds=LASTING)
    finally:
        matrix.remove_pods(["x/d"])


def test_on_kind_egress_holds_towards_a_namespace_created_later(
    matrix: KindMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    in_force(matrix, "z/b")
    matrix.add_pods(["w/a", "w/b"])
    try:
        holds(matrix, "w/a", NOTHING, for_seconds=0)
        holds(matrix, "w/b", NOTHING, for_seconds=LASTING)
    finally:
        matrix.remove_namespace("w")


def test_on_kind_egress_holds_while_a_destination_is_relabelled_out_and_back(
    matrix: KindMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    in_force(matrix, "y/b")
    try:
        matrix.relabel("y/b", pod="e")
        eventually(lambda: not verdicts(matrix, "x/a", "y/b", NOTHING), "y/b out of the peers")
        holds(matrix, "y/b", NOTHING, for_seconds=LASTING)
    finally:
        matrix.relabel("y/b", pod="b")
    eventually(lambda: not verdicts(matrix, "x/a", "y/b", TCP_80), "y/b among the peers again")
    holds(matrix, "y/b", TCP_80, for_seconds=LASTING)
