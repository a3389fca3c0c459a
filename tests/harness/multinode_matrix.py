"""The NetworkPolicy matrix (``kube_matrix``) on a cluster of several nodes.

Pods may be placed on a node (``placement``: "x/a" -> node name). A pod's network
namespace is found through its own node's containerd, and a Service is probed from
a node's namespace (the host runs no kube-proxy: only the nodes do).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.harness.kube_matrix import MATRIX_PROBE, PYTHON, KubeMatrix, KubePod
from tests.harness.multinode import MultiNodeCluster, Node
from tests.harness.node_network import in_netns
from tests.harness.waiting import eventually


@dataclass
class NodesMatrix(KubeMatrix):
    cluster: Any = None  # a MultiNodeCluster: the parts of Cluster the matrix uses

    @property
    def nodes(self) -> MultiNodeCluster:
        return self.cluster

    def node_of(self, key: str) -> Node:
        pod = self.pods[key]
        found = self.cluster.kubectl_json("get", "pod", "-n", pod.namespace, pod.name)
        name = found["spec"]["nodeName"]
        return next(n for n in self.nodes.nodes if n.name == name)

    def _netns(self, pod: KubePod) -> str:
        found = self.cluster.kubectl_json("get", "pod", "-n", pod.namespace, pod.name)
        node = next(n for n in self.nodes.nodes if n.name == found["spec"]["nodeName"])
        containerd = node.containerd()
        ids = containerd.crictl(
            "pods", "--namespace", pod.namespace, "--name", pod.name, "--state", "ready", "-q"
        ).stdout.split()
        assert len(ids) == 1, f"{pod.key} on {node.name}: sandboxes {ids}"
        info = containerd.crictl_json("inspectp", ids[0])
        return f"/proc/{info['info']['pid']}/ns/net"

    def _wait_service(self, pod: KubePod) -> None:
        """Until every node's kube-proxy forwards the pod's ClusterIP."""
        for node in self.nodes.nodes:

            def forwarded(node: Node = node) -> bool:
                probe = [PYTHON, MATRIX_PROBE, json.dumps([[pod.cluster_ip, 80, "tcp"]]), "1"]
                proc = subprocess.run(
                    in_netns(node.netns, probe),
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                return proc.stdout.strip() == "[true]"

            eventually(forwarded, f"{node.name} forwarding {pod.cluster_ip} to {pod.key}", 60)


@contextlib.contextmanager
def placed_matrix(
    cluster: MultiNodeCluster, placement: dict[str, int], pods: Iterable[str]
) -> Iterator[NodesMatrix]:
    """A matrix whose pods ``"x/a"`` go on node ``placement[key]`` (an index), with
    ``pods`` running; destroyed afterwards."""
    made = NodesMatrix(cluster=cluster)
    made.placement = {key: cluster.node(index).name for key, index in placement.items()}
    try:
        made.add_pods(list(pods))
        yield made
    finally:
        made.destroy()


def place(matrix: NodesMatrix, **where: int) -> list[str]:
    """Pods ``x/<name>`` on node ``n<index>``: ``place(matrix, a=1, b=2)``."""
    keys = []
    for name, index in where.items():
        key = f"x/{name}"
        matrix.placement[key] = matrix.nodes.node(index).name
        keys.append(key)
    matrix.add_pods(keys)
    return keys


def received_tcp_80(matrix: NodesMatrix, target: str, source: str) -> int:
    return matrix.received_from(target, source).get(("tcp", 80), 0)


def policy_on_a_from_b_to_c(matrix: NodesMatrix) -> dict[str, Any]:
    """On pod a: ingress only from pod b, egress only to pod c (TCP 80)."""
    return matrix.policy(
        "x",
        "a-from-b-to-c",
        podSelector={"matchLabels": {"pod": "a"}},
        policyTypes=["Ingress", "Egress"],
        ingress=[{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        egress=[
            {
                "to": [{"podSelector": {"matchLabels": {"pod": "c"}}}],
                "ports": [{"protocol": "TCP", "port": 80}],
            }
        ],
    )
