"""Pods through a real kubelet: sluice as the only CNI of a single-node Kubernetes.

The pods run agnhost's ``netexec`` HTTP server. They must get their addresses from
sluice's IPAM (the node's podCIDR), be reachable from the node (as kubelet probes
are), reach each other through a ClusterIP Service (kube-proxy's DNAT on the path),
and leave nothing behind once deleted.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cache import AGNHOST_IMAGE
from tests.harness.cluster import Cluster, ClusterError
from tests.harness.waiting import eventually as wait_until

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NETEXEC_PORT = 8080
SERVICE_PORT = 80
# What a condition on the cluster raises while it does not hold yet.
CLUSTER_NOT_YET = (AssertionError, OSError, subprocess.SubprocessError, ClusterError)


def netexec_pod(name: str) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/hostname", "port": NETEXEC_PORT}, "periodSeconds": 2}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "netexec",
                    "image": AGNHOST_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["netexec", f"--http-port={NETEXEC_PORT}", "--udp-port=-1"],
                    "ports": [{"containerPort": NETEXEC_PORT, "protocol": "TCP"}],
                    "readinessProbe": probe,
                }
            ],
        },
    }


def cluster_ip_service(name: str, selector_app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": selector_app},
            "ports": [{"port": SERVICE_PORT, "targetPort": NETEXEC_PORT, "protocol": "TCP"}],
        },
    }


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)


def wait_ready(cluster: Cluster, namespace: str, *pods: str) -> None:
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "--timeout=120s",
        *(f"pod/{p}" for p in pods), timeout=130,
    )  # fmt: skip


def pod_ip(cluster: Cluster, namespace: str, pod: str) -> str:
    return cluster.kubectl_json("get", "pod", "-n", namespace, pod)["status"]["podIP"]


def allocations(cluster: Cluster) -> list[dict[str, Any]]:
    report = json.loads(cluster.sluicectl("ipam", "show", "-o", "json").stdout)
    (network,) = [n for n in report["networks"] if n["name"] == cluster.network]
    return network["allocations"]


def datapath_endpoints(cluster: Cluster) -> list[dict[str, Any]]:
    report = cluster.sluicectl("datapath", "show", "-o", "json", check=False)
    if report.returncode != 0 and not cluster.bpf_dir.exists():
        return []  # nothing was ever pinned
    if report.returncode != 0:
        raise AssertionError(f"sluicectl datapath show failed: {report.stderr}")
    return [e for e in json.loads(report.stdout)["endpoints"] if e["network"] == cluster.network]


def node_veth_aliases() -> dict[str, str]:
    out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"]: link.get("ifalias", "") for link in json.loads(out)}


def conntrack_entries_for(ip: str) -> list[str]:
    entries: set[str] = set()
    for flag in ("--orig-src", "--orig-dst", "--reply-src", "--reply-dst"):
        out = subprocess.run(
            ["conntrack", "-L", flag, ip], capture_output=True, text=True, check=False
        ).stdout
        entries.update(line for line in out.splitlines() if line.strip())
    return sorted(entries)


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """``tests.harness.waiting.eventually``, also retrying on what a cluster's commands
    and sockets raise while pods start."""
    return wait_until(check, what, timeout, interval=0.5, retry_on=CLUSTER_NOT_YET)


@dataclass
class ServedPods:
    namespace: str
    server: str
    client: str
    service: str


def deploy_server_and_client(cluster: Cluster, namespace: str) -> ServedPods:
    served = ServedPods(namespace, "server", "client", "server")
    apply(
        cluster,
        namespace,
        netexec_pod(served.server),
        netexec_pod(served.client),
        cluster_ip_service(served.service, served.server),
    )
    wait_ready(cluster, namespace, served.server, served.client)
    return served


def connect_through_service(cluster: Cluster, served: ServedPods) -> str:
    """From the client pod to the Service's ClusterIP; returns the server's hostname.

    First a TCP connect as the e2e suite probes (``agnhost connect`` in the client),
    then an HTTP request that the client's netexec makes on our behalf (``/dial``).
    """
    service = cluster.kubectl_json("get", "service", "-n", served.namespace, served.service)
    cluster_ip = service["spec"]["clusterIP"]
    target = f"{cluster_ip}:{SERVICE_PORT}"
    client_ip = pod_ip(cluster, served.namespace, served.client)
    query = urllib.parse.urlencode(
        {"request": "hostname", "protocol": "http", "host": cluster_ip, "port": SERVICE_PORT}
    )
    exec_in_client = ("exec", "-n", served.namespace, served.client, "--")

    def connects() -> str:
        cluster.kubectl(*exec_in_client, "/agnhost", "connect", target, "--timeout=5s")
        dialed = json.loads(http_get(f"http://{client_ip}:{NETEXEC_PORT}/dial?{query}&tries=1"))
        return "".join(dialed.get("responses") or [])

    return eventually(connects, f"client pod reaching Service {target}")


@pytest.fixture(scope="module")
def served(k8s_cluster: Cluster) -> Iterator[ServedPods]:
    with k8s_cluster.fresh_namespace() as namespace:
        yield deploy_server_and_client(k8s_cluster, namespace)


def test_node_is_ready_with_sluice_as_its_cni(k8s_cluster: Cluster) -> None:
    node = k8s_cluster.kubectl_json("get", "node", k8s_cluster.node_name)
    assert node["spec"]["podCIDR"] == k8s_cluster.pod_cidr
    conflists = sorted(p.name for p in k8s_cluster.cni_conf_dir.iterdir())
    assert conflists == [k8s_cluster.sluice_conf.name]


def test_install_takes_the_subnet_from_the_node(k8s_cluster: Cluster, tmp_path: Path) -> None:
    """As an init container does, given spec.nodeName: the conflist gets the podCIDR the
    controller manager allocated to the node."""
    sluicectl = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "sluicectl"

    def install(node: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sluicectl,
                "install",
                "--bin-dir",
                tmp_path / "bin",
                "--conf-dir",
                tmp_path / "net.d",
                "--subnet-from-node",
                node,
                "--kubeconfig",
                k8s_cluster.kubeconfig,
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    installed = install(k8s_cluster.node_name)
    assert installed.returncode == 0, installed.stderr
    conflist = json.loads((tmp_path / "net.d" / "10-sluice.conflist").read_text())
    assert conflist["plugins"][0]["ipam"]["subnet"] == k8s_cluster.pod_cidr
    missing = install("no-such-node")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_pod_addresses_come_from_sluice(k8s_cluster: Cluster, served: ServedPods) -> None:
    subnet = ipaddress.ip_network(k8s_cluster.pod_cidr)
    by_pod = {
        (a["podNamespace"], a["podName"]): a
        for a in allocations(k8s_cluster)
        if a.get("podNamespace") == served.namespace
    }
    for pod in (served.server, served.client):
        ip = pod_ip(k8s_cluster, served.namespace, pod)
        assert ipaddress.ip_address(ip) in subnet, f"{pod} has {ip}, outside {subnet}"
        allocation = by_pod.get((served.namespace, pod))
        assert allocation is not None, f"no IPAM allocation for {pod}: {by_pod}"
        assert allocation["ip"] == ip
        assert allocation["ifname"] == "eth0"


def test_node_reaches_pod(k8s_cluster: Cluster, served: ServedPods) -> None:
    ip = pod_ip(k8s_cluster, served.namespace, served.server)
    assert http_get(f"http://{ip}:{NETEXEC_PORT}/hostname") == served.server


def test_pod_reaches_pod_through_cluster_ip(k8s_cluster: Cluster, served: ServedPods) -> None:
    assert connect_through_service(k8s_cluster, served) == served.server


@dataclass
class DeletedPods:
    """Pods that served traffic and were then deleted, with what they held."""

    ips: set[str]
    container_ids: set[str]
    veth_aliases: set[str]


@pytest.fixture(scope="module")
def deleted_pods(k8s_cluster: Cluster) -> Iterator[DeletedPods]:
    with k8s_cluster.fresh_namespace() as namespace:
        served = deploy_server_and_client(k8s_cluster, namespace)
        pods = (served.server, served.client)
        ips = {pod_ip(k8s_cluster, namespace, pod) for pod in pods}
        # Traffic first, so that conntrack and the datapath have something to forget.
        assert connect_through_service(k8s_cluster, served) == served.server
        ours = [a for a in allocations(k8s_cluster) if a.get("podNamespace") == namespace]
        assert {a["ip"] for a in ours} == ips
        container_ids = {a["containerID"] for a in ours}
        aliases = {f"sluice/{k8s_cluster.network}/{cid}/eth0" for cid in container_ids}
        veths = [name for name, alias in node_veth_aliases().items() if alias in aliases]
        assert len(veths) == len(pods), f"expected one node-side veth per pod: {veths}"
        assert all(re.fullmatch(r"sl[0-9a-f]{12}", name) for name in veths), veths
        assert ips <= {e["ip"] for e in datapath_endpoints(k8s_cluster)}
        assert all(conntrack_entries_for(ip) for ip in ips), "no conntrack entry to forget"

        k8s_cluster.kubectl(
            "delete", "pod", "-n", namespace, *pods, "--wait=true", "--timeout=120s", timeout=130
        )
        yield DeletedPods(ips, container_ids, aliases)


def test_deleting_pods_releases_addresses_veths_and_endpoints(
    k8s_cluster: Cluster, deleted_pods: DeletedPods
) -> None:
    eventually(
        lambda: (
            not [
                a
                for a in allocations(k8s_cluster)
                if a["containerID"] in deleted_pods.container_ids
            ]
        ),
        "IPAM allocations of the deleted pods released",
    )
    eventually(
        lambda: not set(node_veth_aliases().values()) & deleted_pods.veth_aliases,
        "node-side veths of the deleted pods removed",
    )
    eventually(
        lambda: not {e["ip"] for e in datapath_endpoints(k8s_cluster)} & deleted_pods.ips,
        "datapath endpoints of the deleted pods removed",
    )


def test_deleting_pods_leaves_no_conntrack_entries(deleted_pods: DeletedPods) -> None:
    """The kernel's conntrack entries of a deleted pod's addresses (kubelet probes,
    connections through its Service) go with it, so none applies to its successor."""
    eventually(
        lambda: not [e for ip in deleted_pods.ips for e in conntrack_entries_for(ip)],
        "no conntrack entry of the deleted pods' addresses",
        timeout=30,
    )


def labelled_netexec_pod(name: str, **labels: str) -> dict[str, Any]:
    pod = netexec_pod(name)
    pod["metadata"]["labels"].update(labels)
    return pod


class HeldHttp:
    """An HTTP/1.1 connection kept open from a pod (busybox nc), one request a second;
    ``answers()`` counts the responses so far."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str, address: str) -> None:
        loop = (
            "while true; do printf 'GET /hostname HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'; sleep 1; done"
        )
        kubectl = str(cluster.cache.binary("kubectl"))
        self.proc = subprocess.Popen(
            [kubectl, f"--kubeconfig={cluster.kubeconfig}", "exec", "-n", namespace, pod,
             "--", "sh", "-c", f"({loop}) | nc {address} {NETEXEC_PORT}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.count = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            # The bodies have no newline: a status line may follow one on its line.
            with self._lock:
                self.count += line.count("HTTP/1.1 200")

    def answers(self) -> int:
        with self._lock:
            return self.count

    def grows(self, seconds: float = 4.0) -> bool:
        before = self.answers()
        time.sleep(seconds)
        return self.answers() > before

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_agent_restart_under_live_traffic(k8s_cluster: Cluster, crash: bool) -> None:
    """Nothing denied passes and nothing allowed is cut while the agent is away or
    coming back: the pinned datapath keeps judging, the restarted agent adopts it."""
    with k8s_cluster.fresh_namespace() as ns:
        apply(
            k8s_cluster,
            ns,
            labelled_netexec_pod("server", role="server"),
            labelled_netexec_pod("friend", role="friend"),
            labelled_netexec_pod("stranger", role="stranger"),
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "friends-only"},
                "spec": {
                    "podSelector": {"matchLabels": {"role": "server"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
                },
            },
        )
        wait_ready(k8s_cluster, ns, "server", "friend", "stranger")
        server = f"{pod_ip(k8s_cluster, ns, 'server')}:{NETEXEC_PORT}"

        def reaches(pod: str) -> bool:
            proc = k8s_cluster.kubectl(
                "exec", "-n", ns, pod, "--", "/agnhost", "connect", server, "--timeout=2s",
                check=False,
            )  # fmt: skip
            return proc.returncode == 0

        eventually(lambda: reaches("friend") and not reaches("stranger"), "the policy in force")
        held = HeldHttp(k8s_cluster, ns, "friend", server.split(":")[0])
        try:
            assert eventually(held.grows, "the held connection answering", 30)
            k8s_cluster.stop_agent(crash=crash)
            assert reaches("friend") and not reaches("stranger")
            assert held.grows()
            k8s_cluster.start_agent()
            assert reaches("friend") and not reaches("stranger")
            assert held.grows()
        finally:
            held.close()
