"""The NetworkPolicy matrix on the real cluster (sluice's agent resolving from the API):
real NetworkPolicies, real pods, real packets counted where they arrive.

Namespaces x, y, z with pods a, b, c (``tests.harness.kube_matrix``), each serving TCP
and UDP on 80 and 81 behind a ClusterIP Service of its own; every probe goes both to
the pod's address and through its ClusterIP (kube-proxy's DNAT on the path, as in the
e2e suite).

- egress holds towards destinations that appear after the policy: a new pod, a new
  namespace's pods, a pod relabelled out of the policy's peers and back;
- a policy the API server accepted but sluice cannot read isolates what it selects,
  allows nothing by the rule it cannot read, and is reported (log, metric, ``get
  policies``, ``explain``); addresses are read as the API server reads them.
"""

from __future__ import annotations

import ipaddress
import json
import random
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cni.kube.api import Api
from cni.policy.model import Pod, labels_of
from cni.spec.invoke import Invocation
from tests.harness.cluster import Cluster, sluice_agent_argv
from tests.harness.cni_run import TEST_NETNS_PREFIX, PodNamespaces, exec_plugin
from tests.harness.k8s_objects import create_world, set_pod_ips
from tests.harness.kube_matrix import SERVED, KubeMatrix, KubePod, applied_policies
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

VIAS = (False, True)  # by pod address, through the ClusterIP
DNS = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}


@pytest.fixture(scope="module")
def matrix(k8s_cluster: Cluster) -> Iterator[KubeMatrix]:
    made = KubeMatrix(k8s_cluster)
    try:
        made.add_pods([f"{ns}/{pod}" for ns in ("x", "y", "z") for pod in ("a", "b", "c")])
        yield made
    finally:
        made.destroy()


@pytest.fixture
def policies(matrix: KubeMatrix) -> Iterator[Callable[..., None]]:
    """Apply policies for one test; they are deleted afterwards."""
    with applied_policies(matrix) as apply:
        yield apply


def verdicts(
    matrix: KubeMatrix, source: str, target: str, allowed: set[tuple[int, str]]
) -> list[str]:
    """Probe ``source`` -> ``target`` on every served port, by address and through the
    ClusterIP; what differs from ``allowed``, judged by the probe's answer and by what
    the target's servers received from the source."""
    wrong = []
    for via in VIAS:
        before = matrix.received_from(target, source)
        got = {}
        for port, proto in SERVED:
            reached = matrix.probe([source], [target], port, proto, via)[(source, target)]
            if not reached and (port, proto) in allowed:  # a busy machine: once more
                reached = matrix.probe([source], [target], port, proto, via, timeout=5)[
                    (source, target)
                ]
            got[(port, proto)] = reached
        after = matrix.received_from(target, source)
        where = "ClusterIP" if via else "pod address"
        for port, proto in SERVED:
            arrived = after.get((proto, port), 0) - before.get((proto, port), 0)
            expected = (port, proto) in allowed
            if got[(port, proto)] != expected:
                reached = "reached" if got[(port, proto)] else "blocked"
                wrong.append(f"{source} -> {target} {proto}/{port} via {where}: {reached}")
            if not expected and arrived:
                wrong.append(f"{arrived} {proto}/{port} arrived at {target} from {source}")
    return wrong


def holds(
    matrix: KubeMatrix, target: str, allowed: set[tuple[int, str]], for_seconds: float = 12
) -> None:
    """x/a's verdicts towards ``target`` are right now and still right later."""
    wrong = verdicts(matrix, "x/a", target, allowed)
    assert not wrong, "\n".join(wrong)
    time.sleep(for_seconds)
    wrong = verdicts(matrix, "x/a", target, allowed)
    assert not wrong, f"after {for_seconds} s:\n" + "\n".join(wrong)


def egress_tcp_80_to_a_and_b_in_y_and_z(matrix: KubeMatrix) -> dict[str, Any]:
    peer = {
        "namespaceSelector": {
            "matchExpressions": [{"key": "ns", "operator": "In", "values": ["y", "z"]}]
        },
        "podSelector": {
            "matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]
        },
    }
    return matrix.policy(
        "x",
        "egress-80",
        podSelector={"matchLabels": {"pod": "a"}},
        policyTypes=["Egress"],
        egress=[{"to": [peer], "ports": [{"port": 80, "protocol": "TCP"}]}, DNS],
    )


TCP_80 = {(80, "tcp")}
NOTHING: set[tuple[int, str]] = set()


# -- egress towards destinations that appear after the policy -------------------------------


def test_egress_holds_towards_a_pod_created_later(
    matrix: KubeMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    holds(matrix, "y/a", TCP_80, for_seconds=0)
    matrix.add_pods(["x/d"])
    try:
        holds(matrix, "x/d", NOTHING)
    finally:
        matrix.remove_pods(["x/d"])


def test_egress_holds_towards_a_namespace_created_later(
    matrix: KubeMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    holds(matrix, "z/b", TCP_80, for_seconds=0)
    matrix.add_pods(["w/a", "w/b"])
    try:
        holds(matrix, "w/a", NOTHING, for_seconds=0)
        holds(matrix, "w/b", NOTHING)
    finally:
        matrix.remove_namespace("w")


def test_egress_holds_while_a_destination_is_relabelled_out_and_back(
    matrix: KubeMatrix, policies: Callable[..., None]
) -> None:
    policies(egress_tcp_80_to_a_and_b_in_y_and_z(matrix))
    holds(matrix, "y/b", TCP_80, for_seconds=0)
    try:
        matrix.relabel("y/b", pod="e")
        eventually(lambda: not verdicts(matrix, "x/a", "y/b", NOTHING), "y/b out of the peers")
        holds(matrix, "y/b", NOTHING)
    finally:
        matrix.relabel("y/b", pod="b")
    eventually(lambda: not verdicts(matrix, "x/a", "y/b", TCP_80), "y/b among the peers again")
    holds(matrix, "y/b", TCP_80)


# -- a policy sluice cannot read -------------------------------------------------------------


@pytest.fixture
def metrics_port(matrix: KubeMatrix) -> Iterator[int]:
    """The cluster's agent restarted with its metrics served; afterwards as before."""
    cluster = matrix.cluster
    port = random.randint(29100, 29900)
    cluster.replace_agent([*sluice_agent_argv(cluster), "--metrics-address", f"127.0.0.1:{port}"])
    try:
        yield port
    finally:
        cluster.replace_agent(sluice_agent_argv(cluster))


def refused_gauge(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("sluice_policies_refused ")]
    return float(line.split()[1])


def test_a_policy_sluice_cannot_read_isolates_and_is_reported(
    matrix: KubeMatrix, policies: Callable[..., None], metrics_port: int
) -> None:
    # The API server accepts an IPv4-mapped IPv6 except (with a warning); it compares
    # it as IPv6 and matches it as IPv4, and sluice refuses to guess: that rule, which
    # would let every pod in, allows nothing; the readable rule still lets x/b in.
    policy = matrix.policy(
        "x",
        "half-readable",
        podSelector={"matchLabels": {"pod": "a"}},
        policyTypes=["Ingress"],
        ingress=[
            {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]},
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["::ffff:10.1.0.0/112"]}}]},
        ],
    )
    policies(policy)
    cluster = matrix.cluster
    name = f"{matrix.namespace('x')}/half-readable"

    def listed() -> dict[str, Any]:
        found = json.loads(cluster.sluicectl("get", "policies", "-o", "json").stdout)
        (entry,) = [p for p in found["policies"] if p["policy"] == name]
        return entry

    entry = eventually(listed, "the agent lists the policy")
    assert entry["policyTypes"] == ["ingress"] and entry["localPods"] == [
        f"{matrix.namespace('x')}/a"
    ]
    (why,) = entry["refused"]
    assert why.startswith('spec.ingress[1].from[0].ipBlock.except[0] "::ffff:10.1.0.0/112" is an')
    table = cluster.sluicectl("get", "policies").stdout
    assert any(line.startswith(name) and "refused" in line for line in table.splitlines())
    explained = cluster.sluicectl("explain", f"{matrix.namespace('x')}/a").stdout
    assert f"policy {name} is refused" in explained
    assert f"nothing by {name} ingress rule 1: refused" in explained
    assert refused_gauge(metrics_port) == 1
    assert "is refused, in part" in (cluster.log_path("sluice-agent").read_text(errors="replace"))

    for source in ("y/a", "z/c", "x/c"):
        wrong = verdicts(matrix, source, "x/a", NOTHING)
        assert not wrong, "\n".join(wrong)
    wrong = verdicts(matrix, "x/b", "x/a", {(port, proto) for port, proto in SERVED})
    assert not wrong, "\n".join(wrong)


def test_addresses_are_read_as_the_api_server_reads_them(
    matrix: KubeMatrix, policies: Callable[..., None]
) -> None:
    """``010.244.0.0/16`` is 10.244.0.0/16 (legacy leading zeros): x/a may send TCP 81
    to the pods, nothing else."""
    policies(
        matrix.policy(
            "x",
            "leading-zeros",
            podSelector={"matchLabels": {"pod": "a"}},
            policyTypes=["Egress"],
            egress=[
                {"to": [{"ipBlock": {"cidr": "010.244.0.0/16"}}], "ports": [{"port": 81}]},
                DNS,
            ],
        )
    )
    eventually(lambda: not verdicts(matrix, "x/a", "y/c", {(81, "tcp")}), "the policy in force")
    holds(matrix, "z/a", {(81, "tcp")}, for_seconds=0)


# -- no inherited identity -------------------------------------------------------------------


def free_block(cluster: Cluster) -> ipaddress.IPv4Network:
    """A /29 of the node's pod range with no address allocated or cooling."""
    report = json.loads(cluster.sluicectl("ipam", "show", "-o", "json").stdout)
    (network,) = [n for n in report["networks"] if n["name"] == cluster.network]
    taken = {a["ip"] for a in network["allocations"]} | {c["ip"] for c in network["cooling"]}
    blocks = list(ipaddress.ip_network(cluster.pod_cidr).subnets(new_prefix=29))
    for block in reversed(blocks[1:]):  # the first holds the gateway's neighbours
        if not {str(ip) for ip in block} & taken:
            return block
    raise AssertionError(f"no free /29 in {cluster.pod_cidr}")


class Runtime:
    """CNI calls as the runtime makes them, for pods whose sandboxes this test plays:
    pods of the API bound to a node no kubelet runs, wired here through the agent,
    with their addresses taken from one /29."""

    def __init__(self, cluster: Cluster, namespace: str, block: ipaddress.IPv4Network) -> None:
        self.cluster = cluster
        self.namespace = namespace
        conflist = json.loads(cluster.sluice_conf.read_text())
        plugin = dict(conflist["plugins"][0])
        hosts = list(block.hosts())
        plugin["ipam"] = {**plugin["ipam"], "rangeStart": str(hosts[0]), "rangeEnd": str(hosts[-1])}
        self.config = {"cniVersion": conflist["cniVersion"], "name": conflist["name"], **plugin}
        self.netnses = PodNamespaces(f"{TEST_NETNS_PREFIX}k-")
        self.netns_of: dict[str, str] = {}
        self.wired: dict[str, str] = {}  # pod -> container id

    def run(self, command: str, pod: str) -> Invocation:
        container = self.wired.get(pod) or f"k29-{uuid.uuid4().hex[:12]}"
        netns = self.netns_of.setdefault(pod, self.netnses.new()) if command == "ADD" else ""
        run = exec_plugin(
            self.cluster.cni_bin_dir / "sluice",
            command,
            self.config,
            container_id=container,
            netns=netns,
            ifname="eth0",
            cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={pod}",
            cni_path=str(self.cluster.cni_bin_dir),
        )
        if command == "ADD" and run.rc == 0:
            self.wired[pod] = container
        if command == "DEL":
            self.wired.pop(pod, None)
        return run

    def add(self, pod: str) -> tuple[Invocation, str]:
        """The ADD, and the address it gave ("" if it failed)."""
        run = self.run("ADD", pod)
        return run, run.out["ips"][0]["address"].split("/")[0] if run.rc == 0 else ""

    def pod(self, label: str, name: str, ip: str) -> KubePod:
        return KubePod(self.namespace, label, name, ip, netns=self.netns_of[name])

    def cleanup(self) -> None:
        for pod in list(self.wired):
            self.run("DEL", pod)
        self.netnses.cleanup()


def set_pod_phase(api: Api, namespace: str, name: str, phase: str) -> None:
    api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {"phase": phase}})


def test_a_new_pod_never_inherits_the_allowances_of_its_addresss_previous_holder(
    matrix: KubeMatrix, policies: Callable[..., None]
) -> None:
    """A /29 full but for the address of a friend whose sandbox is gone while the API
    still reports it running: the new pod given that address waits until the API lets
    go of the friend, then is denied what the friend was allowed."""
    cluster = matrix.cluster
    api = Api(str(cluster.kubeconfig))
    node = f"sluice-fake-{uuid.uuid4().hex[:6]}"
    label = f"v{uuid.uuid4().hex[:4]}"
    namespace = matrix.namespace(label)
    (server,) = matrix.add_pods([f"{label}/s"])
    policies(
        matrix.policy(
            label,
            "from-friends",
            podSelector={"matchLabels": {"pod": "s"}},
            ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
        )
    )
    roles = {"friend": "friend", "stranger": "stranger", **{f"f{i}": "filler" for i in range(5)}}
    pods = [Pod(namespace, n, labels_of({"role": role}), (), node) for n, role in roles.items()]
    create_world(api, [node], pods=pods)
    runtime = Runtime(cluster, namespace, free_block(cluster))
    try:
        friend_add, held = runtime.add("friend")
        friend_add.ok()
        set_pod_ips(api, namespace, "friend", [held])  # as its kubelet would report it
        for filler in (f"f{i}" for i in range(5)):
            runtime.add(filler)[0].ok()  # the /29 is full
        friend = runtime.pod(label, "friend", held)
        eventually(lambda: friend.reaches([(server.ip, 80, "tcp")], 1) == [True], "friend in")

        # The friend's sandbox goes (its DEL); the API still reports it running.
        runtime.run("DEL", "friend").ok()
        before = server.received().get(("tcp", 80, held), 0)

        def stranger_given_the_address() -> Invocation | None:
            run, _ = runtime.add("stranger")  # until the friend's address is released
            return run if run.rc == 0 or "is still pod" in run.stdout else None

        refused = eventually(stranger_given_the_address, "the stranger's ADD", 90)
        assert refused.rc != 0 and refused.error_code == 11, refused.stdout
        assert f"address {held} is still pod {namespace}/friend's" in refused.stdout

        # The API reports the friend gone: the address is free, and the stranger's.
        set_pod_phase(api, namespace, "friend", "Failed")
        ip = eventually(lambda: runtime.add("stranger")[1], "the stranger wired", 90)
        assert ip == held, f"the stranger got {ip}, not the only address left ({held})"
        stranger = runtime.pod(label, "stranger", ip)
        targets = [(server.ip, 80, "tcp"), (server.cluster_ip, 80, "tcp")]
        assert stranger.reaches(targets, 2) == [False, False]
        assert server.received().get(("tcp", 80, held), 0) == before, "the stranger got in"
    finally:
        runtime.cleanup()
        cluster.kubectl("delete", "node", node, "--ignore-not-found")
        api.close()


CONNECTS = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
)


def connects(pod: KubePod, targets: list[tuple[str, int]], timeout: float) -> list[bool]:
    """A TCP connection (no echo: the API server speaks TLS) from ``pod`` to each."""
    return [
        subprocess.run(
            ["nsenter", f"--net={pod.netns}", "/usr/bin/python3", "-c", CONNECTS,
             address, str(port), str(timeout)],
            capture_output=True, timeout=30, check=False,
        ).returncode == 0
        for address, port in targets
    ]  # fmt: skip


def test_egress_policy_judges_the_api_servers_service(
    matrix: KubeMatrix, policies: Callable[..., None], k8s_cluster: Cluster
) -> None:
    """The kubernetes Service's backend is the API server on the node itself (a
    hostNetwork backend, reached without leaving by any device): a policy that does
    not allow it refuses it through the ClusterIP as by address; one that allows the
    node's address and port lets it through both ways."""
    service = k8s_cluster.kubectl_json("get", "service", "-n", "default", "kubernetes")
    endpoints = k8s_cluster.kubectl_json("get", "endpoints", "-n", "default", "kubernetes")
    api_ip = endpoints["subsets"][0]["addresses"][0]["ip"]
    api_port = endpoints["subsets"][0]["ports"][0]["port"]
    targets = [(service["spec"]["clusterIP"], 443), (api_ip, api_port)]
    pod = matrix.pods["x/a"]
    assert connects(pod, targets, 2.0) == [True, True], "the premise: x/a reaches the API"
    only_dns = matrix.policy(
        "x", "only-dns", podSelector={"matchLabels": {"pod": "a"}}, policyTypes=["Egress"],
        egress=[DNS],
    )  # fmt: skip
    policies(only_dns)
    eventually(lambda: connects(pod, targets, 1.0) == [False, False], "the API refused", 60)
    for _ in range(3):  # and it stays so
        assert connects(pod, targets, 1.0) == [False, False]
    to_api = {"to": [{"ipBlock": {"cidr": f"{api_ip}/32"}}], "ports": [{"port": api_port}]}
    policies({**only_dns, "spec": {**only_dns["spec"], "egress": [DNS, to_api]}})
    eventually(lambda: connects(pod, targets, 2.0) == [True, True], "the API allowed", 60)
