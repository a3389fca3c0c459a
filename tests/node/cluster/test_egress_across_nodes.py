"""Egress holds toward pods that appear later, with the destinations on other nodes.

The sequences of tests/node/agent/test_kubernetes_policy.py on three nodes: x/a on
node 1 has an egress policy allowing only TCP 80 to pods a and b of namespaces y
and z (plus DNS); the servers are on nodes 2 and 3. A pod created later, a
namespace created later and a destination relabelled out and back are judged
right, by pod address and through the ClusterIP, and stay so; what is denied never
arrives at the receiver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.harness.kube_matrix import applied_policies
from tests.harness.multinode import MultiNodeCluster
from tests.harness.multinode_matrix import NodesMatrix, placed_matrix
from tests.harness.waiting import eventually
from tests.node.agent.test_kubernetes_policy import (
    NOTHING,
    TCP_80,
    egress_tcp_80_to_a_and_b_in_y_and_z,
    holds,
    verdicts,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

# Node of each pod: the source on node 1, every destination elsewhere.
PLACEMENT = {"x/a": 1, "x/b": 2, "x/c": 3, "y/a": 2, "y/b": 3, "y/c": 2, "z/a": 3, "z/b": 2,
             "z/c": 3, "x/d": 2, "w/a": 3, "w/b": 2}  # fmt: skip


@pytest.fixture(scope="module")
def matrix(k8s_nodes: MultiNodeCluster) -> Iterator[NodesMatrix]:
    pods = [f"{ns}/{pod}" for ns in ("x", "y", "z") for pod in ("a", "b", "c")]
    with placed_matrix(k8s_nodes, PLACEMENT, pods) as made:
        yield made


@pytest.fixture
def policies(matrix: NodesMatrix) -> Iterator[Callable[..., None]]:
    with applied_policies(matrix) as apply:
        yield apply


def test_egress_to_another_node_holds_towards_a_pod_created_later(
    matrix: NodesMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    eventually(lambda: not verdicts(matrix, "x/a", "y/a", TCP_80), "the policy in force", 60)
    matrix.add_pods(["x/d"])
    try:
        holds(matrix, "x/d", NOTHING)
    finally:
        matrix.remove_pods(["x/d"])


def test_egress_to_another_node_holds_towards_a_namespace_created_later(
    matrix: NodesMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    eventually(lambda: not verdicts(matrix, "x/a", "z/b", TCP_80), "the policy in force", 60)
    matrix.add_pods(["w/a", "w/b"])
    try:
        holds(matrix, "w/a", NOTHING, for_seconds=0)
        holds(matrix, "w/b", NOTHING)
    finally:
        matrix.remove_namespace("w")


def test_egress_to_another_node_holds_while_a_destination_is_relabelled_out_and_back(
    matrix: NodesMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    eventually(lambda: not verdicts(matrix, "x/a", "y/b", TCP_80), "the policy in force", 60)
    try:
        matrix.relabel("y/b", pod="e")
        eventually(lambda: not verdicts(matrix, "x/a", "y/b", NOTHING), "y/b out of the peers")
        holds(matrix, "y/b", NOTHING)
    finally:
        matrix.relabel("y/b", pod="b")
    eventually(lambda: not verdicts(matrix, "x/a", "y/b", TCP_80), "y/b among the peers again")
    holds(matrix, "y/b", TCP_80)
