"""A pod moving nodes (deleted, recreated on another node with a new address) is
judged by its new address on every node.

x/a on node 1 admits only pods labelled pod=b (TCP 80); y/a on node 2 may send
only to pods labelled pod=b of namespace x (TCP 80, plus DNS). x/b moves from
node 2 to node 3: from its new address it reaches x/a (the ingress judged on node
1) and y/a reaches it (the egress judged on node 2), while x/c stays denied both
ways; what is denied never arrives at the receiver. The time from the moved pod
serving to its first allowed connection is printed beside that of a relabelled pod
(pod=c to pod=b) reaching x/a: figures, not assertions (bench/README.md).

Runs before test_nodes.py, whose last test takes node 3 away.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness.kube_matrix import applied_policies
from tests.harness.multinode import MultiNodeCluster
from tests.harness.multinode_matrix import NodesMatrix, placed_matrix
from tests.harness.waiting import eventually
from tests.node.agent.test_kubernetes_policy import DNS, NOTHING, TCP_80, verdicts

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

PLACEMENT = {"x/a": 1, "x/b": 2, "x/c": 3, "y/a": 2}


@pytest.fixture(scope="module")
def matrix(k8s_nodes: MultiNodeCluster) -> Iterator[NodesMatrix]:
    with placed_matrix(k8s_nodes, PLACEMENT, list(PLACEMENT)) as made:
        yield made


@pytest.fixture
def policies(matrix: NodesMatrix) -> Iterator[Callable[..., None]]:
    with applied_policies(matrix) as apply:
        yield apply


def only_pod_b(matrix: NodesMatrix) -> list[dict[str, Any]]:
    pod_b = {"podSelector": {"matchLabels": {"pod": "b"}}}
    in_x = {**pod_b, "namespaceSelector": {"matchLabels": {"ns": "x"}}}
    tcp_80 = [{"port": 80, "protocol": "TCP"}]
    return [
        matrix.policy(
            "x",
            "admit-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Ingress"],
            ingress=[{"from": [pod_b], "ports": tcp_80}],
        ),
        matrix.policy(
            "y",
            "send-to-x-b",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[{"to": [in_x], "ports": tcp_80}, DNS],
        ),
    ]


def until_reached(matrix: NodesMatrix, source: str, target: str, what: str) -> float:
    """Seconds until ``source`` reaches ``target`` on TCP 80 by its address."""
    started = time.monotonic()
    eventually(
        lambda: matrix.probe([source], [target], 80, "tcp")[(source, target)],
        what,
        timeout=60,
        interval=0.1,
    )
    return time.monotonic() - started


def test_a_pod_moved_to_another_node_is_judged_by_its_new_address_everywhere(
    matrix: NodesMatrix, policies: Callable[..., None], capsys: pytest.CaptureFixture[str]
) -> None:
    policies(*only_pod_b(matrix))
    eventually(lambda: not verdicts(matrix, "x/b", "x/a", TCP_80), "the policies in force", 60)
    assert not verdicts(matrix, "x/c", "x/a", NOTHING)
    assert not verdicts(matrix, "y/a", "x/b", TCP_80)
    old = matrix.pods["x/b"].ip

    matrix.remove_pods(["x/b"])
    matrix.placement["x/b"] = matrix.nodes.node(3).name
    matrix.add_pods(["x/b"])  # returns once it serves and every node forwards its Service
    moved = until_reached(matrix, "x/b", "x/a", "x/b from node 3 admitted by x/a")
    sent = until_reached(matrix, "y/a", "x/b", "y/a on node 2 sending to x/b on node 3")
    assert matrix.node_of("x/b").name == matrix.nodes.node(3).name
    new = matrix.pods["x/b"].ip
    assert new != old, f"x/b kept {old} on another node"

    wrong = verdicts(matrix, "x/b", "x/a", TCP_80)
    wrong += verdicts(matrix, "y/a", "x/b", TCP_80)
    wrong += verdicts(matrix, "x/c", "x/a", NOTHING)
    wrong += verdicts(matrix, "y/a", "x/c", NOTHING)
    assert not wrong, "\n".join(wrong)

    # The comparison: a label change, the moved pod's neighbour becoming a "b".
    try:
        matrix.relabel("x/c", pod="b")
        relabelled = until_reached(matrix, "x/c", "x/a", "x/c relabelled pod=b admitted")
    finally:
        matrix.relabel("x/c", pod="c")
    eventually(lambda: not verdicts(matrix, "x/c", "x/a", NOTHING), "x/c denied again", 60)
    with capsys.disabled():  # the figures go to the session's output
        print(
            f"\n[moving pods] moved pod admitted {moved:.2f} s after it served, sent to "
            f"{sent:.2f} s after that; relabelled pod admitted {relabelled:.2f} s after the label"
        )
