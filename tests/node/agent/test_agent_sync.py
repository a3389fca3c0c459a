"""Nothing computed before sync, against a real API server (a control plane of its
own, port base 27000, with a Node that no kubelet runs) and a real agent
resolving on its own, whose pods are wired by the real plugin:

- a restarted agent whose Services have not been listed yet (its ServiceAccount
  may not list them) leaves the datapath's set of ClusterIPs as it was, where it
  used to empty it (egress-isolated pods then lost DNS and Services);
- a Pod the API deletes while its sandbox still runs keeps its labels until the
  CNI DEL: the policy that isolates it still holds, with real packets.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.datapath.maps import Datapath
from tests.harness.agent import AgentNetwork, PolicyPod, k8s_args
from tests.harness.cluster import Cluster
from tests.harness.cni_run import PodNamespaces
from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

PORT_BASE = 27000
CLUSTER = "pytest-sync"
NODE = "sync-node"
ACCOUNT = "sluice-agent-sync"
RBAC = "rbac.authorization.k8s.io/v1"


def apply(cluster: Cluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))


def agent_role(services: bool) -> dict[str, Any]:
    """What the agent resolving on its own reads; Services only when ``services``."""
    core = ["namespaces", "pods", *(["services"] if services else [])]
    return {
        "apiVersion": RBAC,
        "kind": "ClusterRole",
        "metadata": {"name": ACCOUNT},
        "rules": [
            {"apiGroups": [""], "resources": core, "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    made = Cluster(
        CLUSTER,
        cache=_cache_or_skip(),
        port_base=PORT_BASE,
        keep_logs=Path(keep_logs) / CLUSTER if keep_logs else None,
        control_plane_only=True,
    )
    if made.is_up():
        made.down()
    made.up()
    try:
        apply(made, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield made
    finally:
        leftovers = made.down()
        assert not leftovers, f"cluster {CLUSTER} left behind: {leftovers}"


@pytest.fixture(scope="module")
def kubeconfig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ServiceAccount's kubeconfig with only the agent's rights (``agent_role``)."""
    apply(
        cluster,
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": "kube-system"}},
        agent_role(services=True),
        {"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "kube-system"}]},
    )  # fmt: skip
    token = cluster.kubectl(
        "create", "token", ACCOUNT, "-n", "kube-system", "--duration=2h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in admin["users"]:
        user["user"] = {"token": token}
    path = tmp_path_factory.mktemp("sync-kubeconfig") / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    path.chmod(0o600)
    return path


@pytest.fixture
def net(tmp_path: Path, bin_dir: Path, kubeconfig: Path) -> Iterator[AgentNetwork]:
    made = AgentNetwork.create(tmp_path, bin_dir)
    made.agent.extra = ("--kubeconfig", str(kubeconfig), "--node-name", NODE)
    try:
        made.start()
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with cluster.fresh_namespace() as name:
        try:
            yield name
        finally:  # no kubelet would ever confirm a graceful deletion
            cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force")


def pod(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def wired(net: AgentNetwork, pods: PodNamespaces, namespace: str, name: str) -> PolicyPod:
    netns = pods.new()
    cid = f"{name}-{uuid.uuid4().hex[:6]}"
    result = net.network.add(netns, cid, config=net.config(), cni_args=k8s_args(namespace, name))
    return PolicyPod(namespace, name, cid, netns, result["ips"][0]["address"].split("/")[0])


def unwire(net: AgentNetwork, wired_pod: PolicyPod) -> None:
    cni_args = k8s_args(wired_pod.namespace, wired_pod.name)
    net.network.delete(wired_pod.netns, wired_pod.cid, config=net.config(), cni_args=cni_args).ok()


def test_cluster_ips_stay_in_the_datapath_until_services_have_synced(
    cluster: Cluster, net: AgentNetwork, namespace: str, pods: PodNamespaces
) -> None:
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "dns", "namespace": namespace},
            "spec": {"selector": {"app": "dns"}, "ports": [{"port": 53, "protocol": "UDP"}]},
        },
    )
    cluster_ip = cluster.kubectl_json("get", "service", "-n", namespace, "dns")["spec"]["clusterIP"]
    with Datapath(net.config()["bpfDir"]) as dp:
        eventually(lambda: cluster_ip in dp.network.service_ips(), "the ClusterIP in the datapath")
        try:
            # Restarted while it may not list Services: every other kind syncs.
            net.stop()
            apply(cluster, agent_role(services=False))
            net.agent.start(net.socket, wait_ready=False)
            eventually(
                lambda: "not synced yet: services" in str(net.ask({"op": "status"})["reason"]),
                "every kind but Services synced",
            )
            assert cluster_ip in dp.network.service_ips(), (
                "the ClusterIPs were rewritten before sync"
            )
            # An ADD meanwhile waits for the sync, then is told to try again (11);
            # code 50 is STATUS's.
            early = net.network.run(
                "ADD",
                net.config(),
                container_id=f"early-{uuid.uuid4().hex[:6]}",
                netns=pods.new(),
                ifname="eth0",
                cni_args=k8s_args(namespace, "early"),
            )
            assert early.error_code == 11, early.stdout
            assert "policy sources have not synced yet" in early.out["details"], early.stdout
        finally:
            apply(cluster, agent_role(services=True))
        eventually(lambda: net.ask({"op": "status"})["ready"], "the agent synced", timeout=120)
        assert cluster_ip in dp.network.service_ips()
        cluster.kubectl("delete", "service", "-n", namespace, "dns")
        eventually(
            lambda: cluster_ip not in dp.network.service_ips(), "the ClusterIP gone once deleted"
        )


def test_a_deleted_pod_keeps_its_labels_until_its_del(
    cluster: Cluster, net: AgentNetwork, namespace: str, pods: PodNamespaces
) -> None:
    apply(
        cluster,
        pod(namespace, "server", app="server"),
        pod(namespace, "client", app="client"),
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "isolate-server", "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]},
        },
    )
    server = wired(net, pods, namespace, "server")
    client = wired(net, pods, namespace, "client")
    server.serve()
    try:
        eventually(
            lambda: client.reaches([(server.ip, 80, "tcp")]) == [False], "the server isolated"
        )
        # The API deletes the Pod; its sandbox runs on until the runtime's CNI DEL.
        cluster.kubectl("delete", "pod", "-n", namespace, "server", "--grace-period=0", "--force")
        eventually(
            lambda: (
                cluster.kubectl("get", "pod", "-n", namespace, "server", check=False).returncode
                != 0
            ),
            "the Pod gone from the API",
        )
        time.sleep(3.0)  # the agent's watch has delivered the deletion by now
        probes = [client.reaches([(server.ip, 80, "tcp")]) for _ in range(3)]
        assert probes == [[False]] * 3, "a deleted pod's sandbox lost its policy"
        (endpoint,) = [e for e in net.endpoints() if e["containerID"] == server.cid]
        assert endpoint["ingressIsolated"] and endpoint["policies"] == [
            f"{namespace}/isolate-server"
        ], endpoint
    finally:
        server.stop_serving()
    unwire(net, server)
    unwire(net, client)
    assert [e for e in net.endpoints() if e["containerID"] in (server.cid, client.cid)] == []
