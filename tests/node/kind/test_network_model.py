"""The Kubernetes network model, checked on a multi-node kind cluster running sluice
(``make kind``): what a person checks after reading about the model.

* every pod's address lies in its node's ``spec.podCIDR``;
* a pod on one worker reaches a pod on another by its address, and the server sees
  the caller's own pod address (no NAT between pods);
* a node reaches the pods on it (``curl`` inside the node container), every node
  and the API server's proxy reach the pods of every node;
* ``crictl pods`` on a node lists one ready sandbox per pod on it;
* a NetworkPolicy denies across nodes while an allowed peer still gets through;
* a Service's ClusterIP answers from every node;
* a pod on a worker resolves a Service name through CoreDNS, itself on sluice.

The cluster is that of conftest.py: ``KIND_CLUSTER`` (default ``sluice``) when it
exists, else one of the module's own. Docker is driven through the SDK: the node containers
are those of ``tests/harness/kind.py``.

Marker ``kind``: ``make kind-e2e`` runs it, ``make test`` deselects it.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import dockerd, kind
from tests.harness.cache import AGNHOST_IMAGE
from tests.harness.daemonset import DeployedCluster
from tests.harness.waiting import eventually
from tests.node.kind.conftest import NODES

pytestmark = [pytest.mark.kind, pytest.mark.docker, pytest.mark.slow]

PORT = 8080
SERVER = ["/agnhost", "netexec", f"--http-port={PORT}"]
CONNECT_TIMEOUT = "3s"
# Pods start slowly on a loaded machine (2 CPUs shared with other clusters).
POD_TIMEOUT = 300.0


@dataclass
class Model:
    cluster: DeployedCluster
    client: Any  # docker.DockerClient
    namespace: str
    workdir: Path
    pods: dict[str, dict[str, Any]]  # pod name -> its object, once Running

    def node(self, name: str) -> Any:
        nodes = kind.node_containers(self.client, self.cluster.name)
        (found,) = [n for n in nodes if n.name == name]
        return found

    def apply(self, obj: dict[str, Any]) -> None:
        path = self.workdir / f"{obj['kind']}-{obj['metadata']['name']}.json"
        path.write_text(json.dumps(obj))
        self.cluster.kubectl("apply", "-f", str(path))

    def exec(self, pod: str, *argv: str, check: bool = True) -> str:
        return self.cluster.kubectl(
            "exec", "-n", self.namespace, pod, "--", *argv, check=check, timeout=60
        )

    def connects(self, pod: str, ip: str) -> bool:
        return self.connects_to(pod, f"{ip}:{PORT}")

    def connects_to(self, pod: str, target: str) -> bool:
        """``agnhost connect`` (a TCP connect, as the Netpol e2e probes do)."""
        out = self.cluster.kubectl(
            "exec", "-n", self.namespace, pod, "--",
            "/bin/sh", "-c",
            f"/agnhost connect {target} --timeout={CONNECT_TIMEOUT} && echo CONNECTED",
            check=False, timeout=60,
        )  # fmt: skip
        return "CONNECTED" in out

    def ip(self, pod: str) -> str:
        return str(self.pods[pod]["status"]["podIP"])


def pod_object(name: str, namespace: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            # On that node whatever its taints say of scheduling (the control plane's
            # NoSchedule): the checks need a pod on every node.
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": AGNHOST_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": SERVER[1:],
                    "ports": [{"containerPort": PORT}],
                }
            ],
        },
    }


def node_names(cluster: DeployedCluster) -> list[str]:
    return sorted(cluster.pod_cidrs())


def workers(cluster: DeployedCluster) -> list[str]:
    found = cluster.kubectl_json("get", "nodes")["items"]
    return sorted(
        n["metadata"]["name"]
        for n in found
        if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})
    )


@pytest.fixture(scope="module")
def model(cluster: DeployedCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Model]:
    assert len(node_names(cluster)) >= NODES, f"{cluster.name} needs {NODES} nodes"
    assert len(workers(cluster)) >= 2, f"{cluster.name} needs two workers"
    namespace = f"model-{uuid.uuid4().hex[:6]}"
    client = dockerd.ensure().client()
    found = Model(cluster, client, namespace, tmp_path_factory.mktemp("model"), {})
    cluster.kubectl("create", "namespace", namespace)
    try:
        for i, node in enumerate(node_names(cluster)):
            found.apply(pod_object(f"server-{i}", namespace, node, {"role": "server"}))
        first = workers(cluster)[0]
        found.apply(pod_object("allowed", namespace, first, {"role": "allowed"}))
        found.apply(pod_object("other", namespace, first, {"role": "other"}))
        cluster.kubectl(
            "wait", "--for=condition=Ready", "pod", "--all", "-n", namespace,
            f"--timeout={int(POD_TIMEOUT)}s", timeout=POD_TIMEOUT + 30,
        )  # fmt: skip
        pods = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
        found.pods = {p["metadata"]["name"]: p for p in pods}
        yield found
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        client.close()


def server_on(model: Model, node: str) -> str:
    (name,) = [
        n
        for n, p in model.pods.items()
        if n.startswith("server-") and p["spec"]["nodeName"] == node
    ]
    return name


def test_every_pod_address_lies_in_its_nodes_pod_cidr(model: Model) -> None:
    cidrs = model.cluster.pod_cidrs()
    assert len(set(cidrs.values())) == len(cidrs), f"podCIDRs overlap: {cidrs}"
    for name, pod in model.pods.items():
        node = pod["spec"]["nodeName"]
        address = ipaddress.ip_address(pod["status"]["podIP"])
        assert address in ipaddress.ip_network(cidrs[node]), (name, node, str(address), cidrs)


def test_a_pod_reaches_a_pod_on_another_worker_and_is_seen_by_its_own_address(
    model: Model,
) -> None:
    first, second = workers(model.cluster)[:2]
    target = model.ip(server_on(model, second))
    assert model.pods["allowed"]["spec"]["nodeName"] == first
    # netexec's /clientip answers the peer address of the connection as "ip:port";
    # busybox's nc, since its wget crashes in this image (exit 139).
    request = f"printf 'GET /clientip HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {target} {PORT}"
    seen = eventually(
        lambda: (model.exec("allowed", "/bin/sh", "-c", request).splitlines() or [""])[-1],
        f"allowed ({first}) -> {target} ({second})",
        timeout=60,
        retry_on=(AssertionError, kind.KindFailed),
    )
    assert seen.strip().rsplit(":", 1)[0] == model.ip("allowed"), seen


def test_every_node_reaches_its_own_pods(model: Model) -> None:
    for node in node_names(model.cluster):
        ip = model.ip(server_on(model, node))
        result = model.node(node).exec_run(
            ["curl", "-s", "--max-time", "5", f"http://{ip}:{PORT}/hostname"]
        )
        assert result.exit_code == 0, (node, ip, result.output.decode())
        assert result.output.decode().strip() == server_on(model, node)


def test_every_node_and_the_api_servers_proxy_reach_the_pods_of_every_node(
    model: Model,
) -> None:
    """What the API server's proxy, webhooks served by pods and scrapers on the host
    network need, in either routing mode (vxlan: through the tunnel, whatever the
    nodes' strict reverse-path filter says)."""
    servers = [server_on(model, node) for node in node_names(model.cluster)]
    for node in node_names(model.cluster):
        for server in servers:
            ip = model.ip(server)
            result = model.node(node).exec_run(
                ["curl", "-s", "--max-time", "5", f"http://{ip}:{PORT}/hostname"]
            )
            assert result.exit_code == 0, (node, server, ip, result.output.decode())
            assert result.output.decode().strip() == server
    for server in servers:
        path = f"/api/v1/namespaces/{model.namespace}/pods/{server}:{PORT}/proxy/hostname"
        assert model.cluster.kubectl("get", "--raw", path).strip() == server, path


def test_crictl_lists_one_ready_sandbox_per_pod_on_its_node(model: Model) -> None:
    for node in node_names(model.cluster):
        result = model.node(node).exec_run(["crictl", "pods", "--state", "ready", "-o", "json"])
        assert result.exit_code == 0, (node, result.output.decode())
        sandboxes: dict[tuple[str, str], int] = {}
        for item in json.loads(result.output)["items"]:
            key = (item["metadata"]["namespace"], item["metadata"]["name"])
            sandboxes[key] = sandboxes.get(key, 0) + 1
        # The namespaces this module and the deployment own: none of their pods
        # comes or goes meanwhile (other namespaces may hold e2e specs' pods).
        expected = {
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for namespace in (model.namespace, "kube-system")
            for p in model.cluster.kubectl_json(
                "get", "pods", "-n", namespace, "--field-selector", f"spec.nodeName={node}"
            )["items"]
            if p["status"].get("phase") == "Running"
        }
        listed = {k: v for k, v in sandboxes.items() if k[0] in (model.namespace, "kube-system")}
        assert set(listed) == expected, (node, sorted(listed), sorted(expected))
        assert all(count == 1 for count in listed.values()), (node, listed)


def test_a_network_policy_denies_across_nodes(model: Model) -> None:
    first, second = workers(model.cluster)[:2]
    target = model.ip(server_on(model, second))
    assert model.pods["other"]["spec"]["nodeName"] == first
    assert eventually(lambda: model.connects("other", target), "other -> server before policy")
    model.apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "only-allowed", "namespace": model.namespace},
            "spec": {
                "podSelector": {"matchLabels": {"role": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "allowed"}}}]}],
            },
        }
    )
    try:
        eventually(
            lambda: not model.connects("other", target),
            f"other ({first}) denied to {target} ({second})",
            timeout=60,
        )
        # Denied three times in a row, while the allowed peer on the same node connects.
        assert not any(model.connects("other", target) for _ in range(3))
        assert model.connects("allowed", target)
    finally:
        model.cluster.kubectl(
            "delete", "networkpolicy", "only-allowed", "-n", model.namespace, check=False
        )


def test_a_service_cluster_ip_answers_from_every_node(model: Model) -> None:
    model.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "servers", "namespace": model.namespace},
            "spec": {
                "selector": {"role": "server"},
                "ports": [{"port": 80, "targetPort": PORT, "protocol": "TCP"}],
            },
        }
    )
    service = model.cluster.kubectl_json("get", "service", "-n", model.namespace, "servers")
    cluster_ip = service["spec"]["clusterIP"]
    servers = {n for n in model.pods if n.startswith("server-")}
    for node in node_names(model.cluster):

        def answers(node: str = node) -> str:
            result = model.node(node).exec_run(
                ["curl", "-s", "--max-time", "5", f"http://{cluster_ip}/hostname"]
            )
            assert result.exit_code == 0, result.output.decode()
            return result.output.decode().strip()

        # kube-proxy on each node programs the Service a moment after it exists.
        hostname = eventually(answers, f"{cluster_ip} from {node}", timeout=120, interval=1)
        assert hostname in servers, (node, hostname)


def test_a_pod_on_a_worker_resolves_through_coredns_on_sluice(model: Model) -> None:
    # agnhost's Go resolver asks CoreDNS (on sluice's network) through the kube-dns
    # ClusterIP; on kind's default scheduling CoreDNS is on the control plane, so the
    # query crosses nodes.
    coredns = model.cluster.kubectl_json(
        "get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns"
    )
    assert coredns["items"], "no CoreDNS pod"
    name = "kubernetes.default.svc.cluster.local"
    node = model.pods["allowed"]["spec"]["nodeName"]
    eventually(lambda: model.connects_to("allowed", f"{name}:443"), f"{name} from {node}")
