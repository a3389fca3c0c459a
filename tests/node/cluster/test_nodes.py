"""Three real nodes on one machine: topology, pod-to-pod across nodes, NetworkPolicy
across nodes, Kubernetes' own Netpol specs, and a node taken away.

Each node is a network namespace with its own containerd, kubelet, kube-proxy and
sluice agent (tests/harness/multinode.py). The pods' servers count at the receiver
what reached them from which address (tests/harness/kube_matrix.py), so "reached"
and "the source was kept" are the receiver's word, not the client's. The node
removal test runs last: it takes the third node away for good.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.cache import AGNHOST_IMAGE
from tests.harness.cluster import ClusterError
from tests.harness.e2e import NETPOL_SUBSET, NETPOL_SUBSET_FOCUS, NETPOL_SUBSET_SKIP, run_netpol
from tests.harness.multinode import MultiNodeCluster
from tests.harness.multinode_matrix import (
    NodesMatrix,
    place,
    policy_on_a_from_b_to_c,
    received_tcp_80,
)
from tests.harness.node_network import netns_exists
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NOT_YET = (AssertionError, OSError, subprocess.SubprocessError, ClusterError)
SPREAD_REPLICAS = 6


@pytest.fixture
def matrix(k8s_nodes: MultiNodeCluster) -> Iterator[NodesMatrix]:
    matrix = NodesMatrix(cluster=k8s_nodes)
    try:
        yield matrix
    finally:
        matrix.destroy()


def spread_deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": SPREAD_REPLICAS,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "c",
                            "image": AGNHOST_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["pause"],
                        }
                    ],
                },
            },
        },
    }


def test_three_nodes_are_ready_each_with_its_pod_cidr_and_pods_spread_over_them(
    k8s_nodes: MultiNodeCluster,
) -> None:
    nodes = k8s_nodes.kubectl_json("get", "nodes")["items"]
    assert len(nodes) == 3
    cidrs = {n["metadata"]["name"]: ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes}
    assert len(set(cidrs.values())) == 3, cidrs
    assert all(c.subnet_of(ipaddress.ip_network(k8s_nodes.cluster_cidr)) for c in cidrs.values())
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
    with k8s_nodes.fresh_namespace() as namespace:
        name = f"spread-{uuid.uuid4().hex[:6]}"
        manifest = json.dumps(spread_deployment(name))
        k8s_nodes.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)
        k8s_nodes.kubectl(
            "rollout", "status", "-n", namespace, f"deployment/{name}", "--timeout=180s",
            timeout=190,
        )  # fmt: skip
        pods = k8s_nodes.kubectl_json("get", "pods", "-n", namespace, "-l", f"app={name}")
        per_node: dict[str, int] = {}
        for pod in pods["items"]:
            node, ip = pod["spec"]["nodeName"], ipaddress.ip_address(pod["status"]["podIP"])
            assert ip in cidrs[node], f"{pod['metadata']['name']} on {node}: {ip}"
            per_node[node] = per_node.get(node, 0) + 1
        assert per_node == {n: SPREAD_REPLICAS // 3 for n in cidrs}, per_node


def test_pods_on_different_nodes_reach_each_other_with_their_own_addresses(
    matrix: NodesMatrix,
) -> None:
    a, b, c = place(matrix, a=1, b=2, c=3)
    assert len({matrix.node_of(k).name for k in (a, b, c)}) == 3
    reached = matrix.probe([b, c], [a], 80, "tcp")
    assert reached == {(b, a): True, (c, a): True}
    reached = matrix.probe([a], [b, c], 80, "tcp")
    assert reached == {(a, b): True, (a, c): True}
    # Counted by the receiving server under the caller's pod address: no NAT on the way.
    assert received_tcp_80(matrix, a, b) >= 1
    assert received_tcp_80(matrix, a, c) >= 1
    assert received_tcp_80(matrix, b, a) >= 1
    assert received_tcp_80(matrix, c, a) >= 1


def test_a_policy_on_node_1_by_labels_of_pods_on_nodes_2_and_3_holds_both_ways(
    matrix: NodesMatrix,
) -> None:
    a, b, c = place(matrix, a=1, b=2, c=3)
    matrix.apply(policy_on_a_from_b_to_c(matrix))
    expected = {(b, a): True, (c, a): False}
    eventually(
        lambda: matrix.probe([b, c], [a], 80, "tcp") == expected,
        f"ingress to {a} (node 1): from {b} (node 2) only",
        timeout=60,
        retry_on=NOT_YET,
    )
    expected_out = {(a, b): False, (a, c): True}
    eventually(
        lambda: matrix.probe([a], [b, c], 80, "tcp") == expected_out,
        f"egress from {a} (node 1): to {c} (node 3) only",
        timeout=60,
        retry_on=NOT_YET,
    )
    # The receivers' count: what was denied never arrived, what was allowed did (and
    # its reply came back, or the probe would not have connected).
    before = {(t, s): received_tcp_80(matrix, t, s) for t, s in ((a, c), (b, a))}
    assert matrix.probe([b, c], [a], 80, "tcp") == expected
    assert matrix.probe([a], [b, c], 80, "tcp") == expected_out
    assert received_tcp_80(matrix, a, c) == before[(a, c)]
    assert received_tcp_80(matrix, b, a) == before[(b, a)]
    assert received_tcp_80(matrix, a, b) >= 1
    assert received_tcp_80(matrix, c, a) >= 1


def test_networkpolicy_e2e_subset_on_three_nodes(k8s_nodes: MultiNodeCluster) -> None:
    tally = run_netpol(k8s_nodes, focus=NETPOL_SUBSET_FOCUS, skip=NETPOL_SUBSET_SKIP)
    assert not tally.failed and len(tally.passed) == len(NETPOL_SUBSET), tally.summary()


# Last: it takes node 3 away for the rest of the session.
def test_removing_a_node_leaves_the_other_nodes_pods_and_policies_untouched(
    k8s_nodes: MultiNodeCluster, matrix: NodesMatrix
) -> None:
    a, b, c, d = place(matrix, a=1, b=2, c=3, d=2)
    matrix.apply(
        matrix.policy(
            "x",
            "a-from-b",
            podSelector={"matchLabels": {"pod": "a"}},
            ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        )
    )
    expected = {(b, a): True, (d, a): False}
    eventually(
        lambda: matrix.probe([b, d], [a], 80, "tcp") == expected,
        f"ingress to {a}: from {b} only",
        timeout=60,
        retry_on=NOT_YET,
    )
    # Probes made before the policy held may have reached a from d.
    denied_before = received_tcp_80(matrix, a, d)
    survivors = {
        key: k8s_nodes.kubectl_json("get", "pod", "-n", matrix.pods[key].namespace, key[2:])
        for key in (a, b, d)
    }
    removed = k8s_nodes.node(3)
    removed_cidr = removed.pod_cidr
    matrix.pods[c].stop_serving()

    k8s_nodes.remove_node(3)  # kubelet stopped, everything of the node gone, Node deleted

    assert not netns_exists(removed.netns)
    assert not removed.directory.exists()
    names = {n["metadata"]["name"] for n in k8s_nodes.kubectl_json("get", "nodes")["items"]}
    assert removed.name not in names and len(names) == 2
    for node in k8s_nodes.nodes:
        routes = {r["dst"] for r in k8s_nodes.node_network.routes(node.index)}
        assert removed_cidr not in routes, f"{node.name} still routes {removed_cidr}"
    for key, before in survivors.items():
        now = k8s_nodes.kubectl_json("get", "pod", "-n", matrix.pods[key].namespace, key[2:])
        assert now["metadata"]["uid"] == before["metadata"]["uid"], key
        assert now["status"]["podIP"] == before["status"]["podIP"], key
        assert now["status"]["phase"] == "Running", key
    matrix.pods.pop(c)
    assert matrix.probe([b, d], [a], 80, "tcp") == expected
    received = received_tcp_80(matrix, a, b)
    assert matrix.probe([b], [a], 80, "tcp") == {(b, a): True}
    assert received_tcp_80(matrix, a, b) > received
    assert received_tcp_80(matrix, a, d) == denied_before
