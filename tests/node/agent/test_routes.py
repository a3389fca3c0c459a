"""Routes between nodes, kept by real agents from a real API server.

Three "nodes", each a network namespace with one interface on a shared bridge (the
node network) and a real ``sluicectl agent --kubeconfig`` of its own (stateDir,
bpfDir, socket; authenticated as the agent's ServiceAccount of
conf/sluice-rbac.yaml, so that its ClusterRole is shown to suffice), all watching
the Node objects of one control plane (no kubelet: the test writes each Node's
podCIDR and InternalIP). Pods are wired through the
``sluice`` executable against each node's agent, in namespaces of their own.

Proved here: the routes follow the Nodes (created, deleted), a restarted agent
removes nothing before it has the full list of Nodes, a route of somebody else's
is never touched; a pod on another node sees the caller's own address (TCP and
UDP, no NAT); with a bridge rule that drops every packet whose source is not a
node, native routing fails and VXLAN passes with the sources still preserved and
the pod MTU 50 bytes smaller; NetworkPolicy judges the inner packet; a deleted
Node's routes and tunnel peers are gone from the others, theirs untouched; in prefix
mode each block another node claims is routed, and a PrefixClaim that is no block of
the pool (an administrator's, past the admission policy) never is, nor is it adopted.

The agents run under ``nsenter --net`` (not ``ip netns exec``, which remounts /sys
and so hides the bpffs where each node's datapath stays pinned across a restart);
``"uplinks": []`` since that leaves /sys/class/net the host's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.kube import prefixclaims
from cni.net import vxlan
from cni.net.peer_routes import PROTOCOL
from tests.harness.agent import NETPROBE, PYTHON, AgentProcess, k8s_args
from tests.harness.claims import CRD, apply, claims_by_node, prefix_ipam
from tests.harness.cluster import Cluster
from tests.harness.cni_run import (
    SESSION_TAG,
    TEST_NETNS_PREFIX,
    TEST_NETWORK_PREFIX,
    Network,
    PodNamespaces,
    in_netns,
)
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

TAG = f"{SESSION_TAG}{uuid.uuid4().hex[:3]}"
NODE_NET = ipaddress.IPv4Network(f"192.168.{random.randint(100, 199)}.0/24")
BRIDGE_ADDRESS = str(NODE_NET.network_address + 254)
CLUSTER = ipaddress.IPv4Network(f"10.{random.randint(160, 199)}.0.0/16")
BRIDGE = f"rtbr{TAG}"
FILTER_TABLE = f"slt_rt{TAG}"
NODES = 3
RBAC = Path(__file__).resolve().parents[3] / "conf" / "sluice-rbac.yaml"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


@dataclass
class SimNode:
    """One node: its network namespace, Node object, network and agent."""

    index: int
    cluster: Cluster
    network: Network
    workdir: Path

    def __post_init__(self) -> None:
        self.name = f"rt{TAG}-n{self.index}"
        self.netns = f"{TEST_NETNS_PREFIX}rtn{self.index}-{TAG}"
        self.address = str(NODE_NET.network_address + 10 + self.index)
        self.pod_cidr = str(list(CLUSTER.subnets(new_prefix=24))[self.index])
        self.socket = str(self.workdir / "run" / "agent.sock")
        self.bpf_dir = f"/sys/fs/bpf/slt-{os.getpid()}-rt{TAG}-{self.index}"
        self.conflist = self.workdir / "net.conflist"
        self.agent: AgentProcess | None = None
        self.kubeconfig = self.cluster.kubeconfig  # the agent's (see agent_kubeconfig)
        self.ipam: dict[str, Any] = {"type": "sluice-ipam", "subnet": self.pod_cidr}
        self.agent_args: tuple[str, ...] = ()  # more of the agent's options

    # -- the node ----------------------------------------------------------------------

    @property
    def host_end(self) -> str:
        return f"rtv{TAG}{self.index}"

    def create_namespace(self) -> None:
        host_end = self.host_end
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "eth0", "netns", self.netns)
        sh("ip", "link", "set", host_end, "master", BRIDGE, "up")
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "addr", "add", f"{self.address}/{NODE_NET.prefixlen}", "dev", "eth0")
        self.run("ip", "link", "set", "eth0", "up")
        self.run("ip", "route", "add", "default", "via", BRIDGE_ADDRESS)
        self.run("sysctl", "-qw", "net.ipv4.ip_forward=1")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.netns, *argv, check=check)

    def routes(self) -> dict[str, dict[str, Any]]:
        """The node's routes of sluice's protocol, by destination."""
        out = self.run("ip", "-j", "-4", "route", "show", "proto", str(PROTOCOL)).stdout
        return {r["dst"]: r for r in json.loads(out or "[]")}

    def route_gateways(self) -> dict[str, str]:
        return {dst: r.get("gateway", "") for dst, r in self.routes().items()}

    def tunnel_peers(self) -> tuple[set[str], set[str]]:
        """(neighbour entries, FDB destinations) on the tunnel device."""
        neigh = self.run("ip", "-j", "neigh", "show", "dev", vxlan.DEVICE, check=False).stdout
        fdb = self.run("bridge", "-j", "fdb", "show", "dev", vxlan.DEVICE, check=False).stdout
        return (
            {n["dst"] for n in json.loads(neigh or "[]") if "PERMANENT" in n.get("state", [])},
            {f["dst"] for f in json.loads(fdb or "[]") if f.get("dst")},
        )

    # -- the Node object ---------------------------------------------------------------

    def create_node_object(self) -> None:
        create_node_object(self.cluster, self.name, self.pod_cidr, self.address)

    # -- the agent ---------------------------------------------------------------------

    def plugin_config(self, routing: str) -> dict[str, Any]:
        return self.network.config(
            policy="enforce",
            agentSocket=self.socket,
            bpfDir=self.bpf_dir,
            stateDir=str(self.workdir / "state"),
            ipam=self.ipam,
            clusterCIDR=str(CLUSTER),
            uplinks=[],
            routing=routing,
        )

    def start_agent(self, routing: str, wait: bool = True) -> None:
        plugin = {
            k: v for k, v in self.plugin_config(routing).items() if k not in ("name", "cniVersion")
        }
        self.conflist.write_text(
            json.dumps({"cniVersion": "1.1.0", "name": self.network.name, "plugins": [plugin]})
        )
        self.routing = routing
        self.agent = AgentProcess(
            self.conflist,
            self.workdir / "agent.log",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node-name",
            self.name,
            *self.agent_args,
            wrapper=("nsenter", f"--net=/run/netns/{self.netns}"),
        )
        if wait:
            self.agent.start(self.socket)
        else:
            self.agent.launch()

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.stop()

    def log(self) -> str:
        return self.agent.log() if self.agent else ""

    # -- pods --------------------------------------------------------------------------

    def add_pod(self, netns: str, cid: str, pod: tuple[str, str] | None = None) -> str:
        """Wire a pod through this node's agent; its address."""
        args = k8s_args(*pod) if pod else ""
        result = self.network.add(
            netns, cid, config=self.plugin_config(self.routing), cni_args=args
        )
        return str(result["ips"][0]["address"].split("/")[0])

    def delete_pod(self, netns: str, cid: str, pod: tuple[str, str] | None = None) -> None:
        args = k8s_args(*pod) if pod else ""
        self.network.delete(netns, cid, config=self.plugin_config(self.routing), cni_args=args).ok()

    def cleanup(self) -> None:
        self.stop_agent()
        # The host end first: a namespace outlives its name while a closed TCP
        # connection of the agent's is still finishing, and with it the pair.
        sh("ip", "link", "del", self.host_end, check=False)
        sh("ip", "netns", "del", self.netns, check=False)  # its veths and routes with it
        shutil.rmtree(self.bpf_dir, ignore_errors=True)


def create_node_object(cluster: Cluster, name: str, pod_cidr: str, address: str) -> None:
    """A Node without a kubelet: its podCIDR in the spec, its InternalIP in the status."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
    }
    apply(cluster, node)
    status = {"status": {"addresses": [{"type": "InternalIP", "address": address}]}}
    cluster.kubectl(
        "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


def delete_node_object(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_network() -> Iterator[None]:
    """The bridge that plays the node network, with the host on it (the way to the API)."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    try:
        sh("ip", "addr", "add", f"{BRIDGE_ADDRESS}/{NODE_NET.prefixlen}", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        yield
    finally:
        sh("nft", "delete", "table", "bridge", FILTER_TABLE, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)


@pytest.fixture(scope="module")
def agent_kubeconfig(k8s_control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's ServiceAccount of conf/sluice-rbac.yaml, with exactly what its
    ClusterRole grants (every user of the harness's token file is an admin)."""
    cluster = k8s_control_plane
    cluster.kubectl("apply", "-f", str(RBAC))
    token = cluster.kubectl(
        "create", "token", "sluice-agent", "-n", "kube-system", "--duration=6h"
    ).stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = tmp_path_factory.mktemp("agent-kubeconfig") / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def nodes(
    k8s_control_plane: Cluster,
    agent_kubeconfig: Path,
    node_network: None,
    tmp_path_factory: pytest.TempPathFactory,
    bin_dir: Path,
) -> Iterator[list[SimNode]]:
    workdir = tmp_path_factory.mktemp("routes")
    network = Network(
        name=f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}",
        subnet=str(CLUSTER),  # each node's own subnet is in its plugin config
        state_dir=workdir / "unused",
        bin_dir=bin_dir,
    )
    made = []
    try:
        for index in range(1, NODES + 1):
            node = SimNode(index, k8s_control_plane, network, workdir / f"n{index}")
            node.workdir.mkdir()
            node.kubeconfig = agent_kubeconfig
            made.append(node)
            node.create_namespace()
            node.create_node_object()
        for node in made:
            node.start_agent("native")
        yield made
    finally:
        for node in made:
            node.cleanup()
        for node in made:
            delete_node_object(k8s_control_plane, node.name)


def expected_routes(nodes: list[SimNode], me: SimNode) -> dict[str, str]:
    return {n.pod_cidr: n.address for n in nodes if n is not me}


def wait_for_routes(node: SimNode, routes: dict[str, str], what: str) -> None:
    def check() -> bool:
        present = node.route_gateways()
        assert present == routes, f"routes {present}, wanted {routes}"
        return True

    try:
        eventually(check, f"{node.name}: {what}", timeout=60)
    except AssertionError as err:
        log = node.log()[-6000:]
        raise AssertionError(f"{err}\n--- agent log of {node.name} ---\n{log}") from None


def restart_all(nodes: list[SimNode], routing: str) -> None:
    for node in nodes:
        node.stop_agent()
    for node in nodes:
        node.start_agent(routing)


# -- serving and probing -----------------------------------------------------------------


class Server:
    """netprobe serving TCP 8080 and UDP 5000 in a pod; who it heard from."""

    def __init__(self, netns: str) -> None:
        command = ["ip", "netns", "exec", Path(netns).name, PYTHON, NETPROBE, "serve"]
        self.proc = subprocess.Popen(
            [*command, "--tcp", "8080", "--udp", "5000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def sources(self) -> set[tuple[str, str]]:
        """(protocol, source address) of everything heard so far."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("sources\n")
        self.proc.stdin.flush()
        return {(proto, source) for proto, _, source, _ in json.loads(self.proc.stdout.readline())}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def tcp_reaches(netns: str, ip: str, timeout: float = 2.0) -> bool:
    proc = in_netns(netns, PYTHON, NETPROBE, "connect", ip, "8080", "--timeout", str(timeout))
    return proc.returncode == 0


def send_udp(netns: str, ip: str) -> None:
    in_netns(netns, PYTHON, NETPROBE, "udp", ip, "5000", "--count", "3", check=True)


def pod_mtu(netns: str) -> int:
    out = in_netns(netns, "ip", "-j", "link", "show", "eth0", check=True).stdout
    return int(json.loads(out)[0]["mtu"])


# -- tests ---------------------------------------------------------------------------------


def test_routes_follow_node_objects_and_leave_others_alone(
    nodes: list[SimNode], k8s_control_plane: Cluster
) -> None:
    for node in nodes:
        wait_for_routes(node, expected_routes(nodes, node), "a route per other node")
        assert all(r.get("dev") == "eth0" for r in node.routes().values())
    first = nodes[0]
    # Somebody else's routes: one to a range no Node has, one to the range of the Node
    # that is about to appear (sluice must not replace it).
    foreign_dst = str(list(CLUSTER.subnets(new_prefix=24))[200])
    extra_cidr = str(list(CLUSTER.subnets(new_prefix=24))[9])
    extra_address = str(NODE_NET.network_address + 19)
    first.run("ip", "route", "add", foreign_dst, "via", nodes[1].address, "proto", "static")
    first.run("ip", "route", "add", extra_cidr, "via", nodes[2].address, "proto", "static")
    extra = f"rt{TAG}-extra"
    create_node_object(k8s_control_plane, extra, extra_cidr, extra_address)
    try:
        for node in nodes[1:]:
            routes = {**expected_routes(nodes, node), extra_cidr: extra_address}
            wait_for_routes(node, routes, "a route to the new Node")
        assert (
            "not routing"
            in eventually(
                lambda: [line for line in first.log().splitlines() if extra_cidr in line][-1:],
                "the blocked route reported",
            )[0]
        )
    finally:
        delete_node_object(k8s_control_plane, extra)
    for node in nodes:
        wait_for_routes(node, expected_routes(nodes, node), "the deleted Node's route gone")
    table = first.run("ip", "-j", "-4", "route", "show", "proto", "static").stdout
    kept = {r["dst"]: r["gateway"] for r in json.loads(table)}
    assert kept == {foreign_dst: nodes[1].address, extra_cidr: nodes[2].address}
    first.run("ip", "route", "del", foreign_dst, "proto", "static")
    first.run("ip", "route", "del", extra_cidr, "proto", "static")


def test_forged_node_objects_divert_no_pod_traffic(
    nodes: list[SimNode], pods: PodNamespaces, k8s_control_plane: Cluster
) -> None:
    """Two hostile Nodes: one with a range inside the second node's podCIDR (a takeover:
    it would win the longest match), one whose InternalIP is a pod's address on the
    first node (whose /32 to that pod is on-link, so the kernel would take the route).
    Neither gets a route anywhere, the contested range is routed to nobody (it is not
    known which node holds it), and all comes back once they are gone."""
    first, second, third = nodes
    assert all(n.routing == "native" for n in nodes)
    netns = pods.new()
    pod_ip = first.add_pod(netns, "forged-decoy")
    takeover_cidr = str(list(ipaddress.IPv4Network(second.pod_cidr).subnets(new_prefix=25))[1])
    decoy_cidr = str(list(CLUSTER.subnets(new_prefix=24))[11])
    takeover, decoy = f"rt{TAG}-takeover", f"rt{TAG}-decoy"
    create_node_object(
        k8s_control_plane, takeover, takeover_cidr, str(NODE_NET.network_address + 66)
    )
    create_node_object(k8s_control_plane, decoy, decoy_cidr, pod_ip)
    try:
        for node, why in ((first, "is a pod address"), (second, "is a pod address"),
                          (third, "neither is routed")):  # fmt: skip
            eventually(
                lambda n=node, w=why: any(w in line for line in n.log().splitlines()),
                f"{node.name}: the forged Nodes reported",
            )
        for node in (first, third):
            routes = expected_routes(nodes, node)
            del routes[second.pod_cidr]
            wait_for_routes(node, routes, "no route to the contested range")
        wait_for_routes(second, expected_routes(nodes, second), "its own range kept out")
    finally:
        delete_node_object(k8s_control_plane, takeover)
        delete_node_object(k8s_control_plane, decoy)
        first.delete_pod(netns, "forged-decoy")
    for node in nodes:
        wait_for_routes(node, expected_routes(nodes, node), "the forged Nodes gone")


def test_a_restarted_agent_removes_nothing_before_the_full_list(
    nodes: list[SimNode], k8s_control_plane: Cluster
) -> None:
    first = nodes[0]
    first.stop_agent()
    # A route an earlier agent wrote for a Node deleted while no agent ran.
    stale = str(list(CLUSTER.subnets(new_prefix=24))[50])
    first.run("ip", "route", "add", stale, "via", nodes[1].address, "proto", str(PROTOCOL))
    # The API out of reach: the agent starts but cannot list.
    port = _api_port(k8s_control_plane)
    reject = f"type filter hook output priority 0; tcp dport {port} reject with tcp reset;"
    rules = f"table ip {FILTER_TABLE} {{ chain out {{ {reject} }}; }}"
    first.run("nft", rules)
    try:
        offset = len(first.log())
        first.start_agent("native", wait=False)

        def since_restart() -> str:
            return first.log()[offset:]

        # A pass of the keeper and several failed lists later: nothing removed.
        eventually(
            lambda: "routes are added, none removed" in since_restart(),
            "a pass without the list",
            timeout=120,
        )
        eventually(
            lambda: since_restart().count("nodes: ") >= 3, "the list of Nodes retried", timeout=120
        )
        assert first.route_gateways() == {**expected_routes(nodes, first), stale: nodes[1].address}
    finally:
        first.run("nft", "delete", "table", "ip", FILTER_TABLE, check=False)
    assert first.agent is not None
    first.agent.wait_ready(first.socket)
    wait_for_routes(first, expected_routes(nodes, first), "the stale route removed after the list")


def _api_port(cluster: Cluster) -> int:
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return int(server.rsplit(":", 1)[1].rstrip("/"))


def test_pods_on_two_nodes_see_each_others_own_address(
    nodes: list[SimNode], pods: PodNamespaces
) -> None:
    client_ns, server_ns = pods.new(), pods.new()
    client_ip = nodes[0].add_pod(client_ns, "client-native")
    server_ip = nodes[1].add_pod(server_ns, "server-native")
    server = Server(server_ns)
    try:
        assert eventually(lambda: tcp_reaches(client_ns, server_ip), "TCP across nodes")
        send_udp(client_ns, server_ip)
        eventually(lambda: ("udp", client_ip) in server.sources(), "the UDP source")
        assert server.sources() == {("tcp", client_ip), ("udp", client_ip)}
    finally:
        server.stop()
        nodes[0].delete_pod(client_ns, "client-native")
        nodes[1].delete_pod(server_ns, "server-native")


def test_a_filtering_node_network_needs_the_tunnel(
    nodes: list[SimNode], pods: PodNamespaces
) -> None:
    """The bridge drops every packet whose source is not a node: native routing fails,
    VXLAN passes, with the caller's own address and the pod MTU 50 bytes smaller."""
    allowed = ", ".join([BRIDGE_ADDRESS, *(n.address for n in nodes)])
    chain = (
        "type filter hook forward priority 0; "
        f"ether type ip ip saddr != {{ {allowed} }} counter drop;"
    )
    sh("nft", f"table bridge {FILTER_TABLE} {{ chain forward {{ {chain} }}; }}")
    client_ns, server_ns = pods.new(), pods.new()
    nodes[0].add_pod(client_ns, "client-filtered")
    server_ip = nodes[1].add_pod(server_ns, "server-filtered")
    server = Server(server_ns)
    try:
        assert not tcp_reaches(client_ns, server_ip), "pod sources crossed a filtering network"
    finally:
        server.stop()
        nodes[0].delete_pod(client_ns, "client-filtered")
        nodes[1].delete_pod(server_ns, "server-filtered")

    restart_all(nodes, "vxlan")
    for node in nodes:
        wanted = expected_routes(nodes, node)
        wait_for_routes(node, wanted, "a route per other node through the tunnel")
        assert all(r.get("dev") == vxlan.DEVICE and "onlink" in r.get("flags", [])
                   for r in node.routes().values()), node.routes()  # fmt: skip
        peers = set(wanted.values())
        eventually(lambda n=node, p=peers: n.tunnel_peers() == (p, p), f"{node.name}: peers")
        tunnel = json.loads(node.run("ip", "-j", "-d", "link", "show", vxlan.DEVICE).stdout)[0]
        assert tunnel["address"] == vxlan.vtep_mac(ipaddress.IPv4Address(node.address))
        assert tunnel["mtu"] == 1450
        # Service flows to backends on other nodes leave through the tunnel: its uplink
        # program judges them, attached before the first route went through it.
        pinned = os.path.exists(f"{node.bpf_dir}/links/{tunnel['ifindex']}_uplink")  # tcx
        filters = node.run("tc", "filter", "show", "dev", vxlan.DEVICE, "egress", check=False)
        assert pinned or " bpf " in filters.stdout, f"{node.name}: no uplink program on the tunnel"
    client_ns, server_ns = pods.new(), pods.new()
    client_ip = nodes[0].add_pod(client_ns, "client-vxlan")
    server_ip = nodes[1].add_pod(server_ns, "server-vxlan")
    assert pod_mtu(client_ns) == pod_mtu(server_ns) == 1450
    server = Server(server_ns)
    try:
        assert eventually(lambda: tcp_reaches(client_ns, server_ip), "TCP through the tunnel")
        send_udp(client_ns, server_ip)
        eventually(lambda: ("udp", client_ip) in server.sources(), "the UDP source")
        assert server.sources() == {("tcp", client_ip), ("udp", client_ip)}
    finally:
        server.stop()
        nodes[0].delete_pod(client_ns, "client-vxlan")
        nodes[1].delete_pod(server_ns, "server-vxlan")


def test_policy_judges_the_inner_packet(
    nodes: list[SimNode], pods: PodNamespaces, k8s_control_plane: Cluster
) -> None:
    """Ingress to a pod on node 1 allowed from one pod's address on node 2 and from node
    3's own address: the pod on node 3 is denied, as its inner source is its own."""
    assert all(n.routing == "vxlan" for n in nodes)
    cluster = k8s_control_plane
    ns = "default"
    names = {"server": nodes[0], "good": nodes[1], "bad": nodes[2]}
    suffix = uuid.uuid4().hex[:6]
    objects = {
        role: {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"rt-{role}-{suffix}", "namespace": ns, "labels": {"role": role}},
            "spec": {
                "nodeName": node.name,
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        for role, node in names.items()
    }
    apply(cluster, *objects.values())
    netns = {role: pods.new() for role in names}
    ips: dict[str, str] = {}
    policy_name = f"rt-inner-{suffix}"
    server: Server | None = None
    try:
        for role, node in names.items():
            ips[role] = node.add_pod(netns[role], f"{role}-{suffix}", (ns, f"rt-{role}-{suffix}"))
        server = Server(netns["server"])
        assert tcp_reaches(netns["bad"], ips["server"]), "no policy yet: everything passes"
        allowed = [f"{ips['good']}/32", f"{nodes[2].address}/32"]
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": policy_name, "namespace": ns},
            "spec": {
                "podSelector": {"matchLabels": {"role": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"ipBlock": {"cidr": c}} for c in allowed]}],
            },
        }
        apply(cluster, policy)
        eventually(
            lambda: not tcp_reaches(netns["bad"], ips["server"], timeout=1),
            "the pod on node 3 denied",
        )
        assert tcp_reaches(netns["good"], ips["server"])
        sources = server.sources()
        assert ("tcp", ips["good"]) in sources and ("tcp", nodes[2].address) not in sources
    finally:
        if server is not None:
            server.stop()
        cluster.kubectl("delete", "networkpolicy", "-n", ns, policy_name, "--ignore-not-found")
        for role, node in names.items():
            if role in ips:
                node.delete_pod(netns[role], f"{role}-{suffix}", (ns, f"rt-{role}-{suffix}"))
        for obj in objects.values():
            cluster.kubectl("delete", "pod", "-n", ns, obj["metadata"]["name"],
                            "--ignore-not-found", "--grace-period=0", "--force")  # fmt: skip


def test_a_deleted_node_leaves_the_others_routes_and_pods(
    nodes: list[SimNode], pods: PodNamespaces, k8s_control_plane: Cluster
) -> None:
    assert all(n.routing == "vxlan" for n in nodes)
    first, second, third = nodes
    client_ns, server_ns = pods.new(), pods.new()
    client_ip = first.add_pod(client_ns, "client-removal")
    server_ip = second.add_pod(server_ns, "server-removal")
    server = Server(server_ns)
    try:
        third.stop_agent()  # its kubelet stopped, then its Node deleted
        delete_node_object(k8s_control_plane, third.name)
        for node in (first, second):
            survivors = [n for n in nodes if n is not third]
            wait_for_routes(node, expected_routes(survivors, node), "the deleted Node's route")
            other = next(n for n in survivors if n is not node).address
            eventually(lambda n=node, o=other: n.tunnel_peers() == ({o}, {o}), "its peer gone")
        assert tcp_reaches(client_ns, server_ip)
        assert ("tcp", client_ip) in server.sources()
    finally:
        server.stop()
        first.delete_pod(client_ns, "client-removal")
        second.delete_pod(server_ns, "server-removal")


def test_prefix_mode_routes_each_prefix_another_node_holds(
    nodes: list[SimNode], pods: PodNamespaces, k8s_control_plane: Cluster
) -> None:
    """Claims in the API: a block node 1 claims for its pod is routed on node 2 via
    node 1 (through the tunnel), and the route goes when the released block's claim
    is deleted."""
    cluster = k8s_control_plane
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRD))
    pool = str(list(CLUSTER.subnets(new_prefix=24))[100])
    first, second = nodes[0], nodes[1]
    for node in (first, second):
        node.stop_agent()
        node.ipam = prefix_ipam(pool, node.name, warmPrefixes=0, cooldownSeconds=0)
        node.kubeconfig = cluster.kubeconfig  # the claims' writes are granted apart
    for node in (first, second):
        node.start_agent("vxlan")  # the bridge still drops what is not from a node
    for node in (first, second):  # the node-CIDR routes are no longer wanted
        wait_for_routes(node, {}, "no route while nobody holds a prefix")
    client_ns, server_ns = pods.new(), pods.new()
    client_ip = first.add_pod(client_ns, "client-prefix")
    server_ip = second.add_pod(server_ns, "server-prefix")
    held = claims_by_node(cluster, pool)
    assert set(held) == {first.name, second.name}, held
    assert ipaddress.IPv4Address(client_ip) in ipaddress.IPv4Network(held[first.name][0])
    wait_for_routes(second, {held[first.name][0]: first.address}, "the route to node 1's block")
    wait_for_routes(first, {held[second.name][0]: second.address}, "the route to node 2's block")
    server = Server(server_ns)
    try:
        assert eventually(lambda: tcp_reaches(client_ns, server_ip), "TCP between prefixes")
        assert server.sources() == {("tcp", client_ip)}
    finally:
        server.stop()
        first.delete_pod(client_ns, "client-prefix")
        second.delete_pod(server_ns, "server-prefix")
    # The emptied blocks are given back (cooldown 0) and their claims deleted.
    eventually(lambda: not claims_by_node(cluster, pool), "the claims released", timeout=120)
    for node in (first, second):
        wait_for_routes(node, {}, "the released block's route gone")


METRICS_PORT = 9479  # an agent's --metrics-address, in its node's namespace


def node_metric(node: SimNode, name: str) -> float:
    """A metric of the node's agent, summed over its label sets."""
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    text = node.run(PYTHON, "-c", fetch, f"http://127.0.0.1:{METRICS_PORT}/metrics").stdout
    samples = [line for line in text.splitlines() if line.startswith((f"{name}{{", f"{name} "))]
    assert samples, f"{node.name}: no metric {name}"
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


def forged_claim(
    cluster: Cluster, prefix: str, holder: SimNode, pool: str, stated_pool: str | None = None
) -> dict[str, Any]:
    """A PrefixClaim as an administrator's credential may write it (the admission policy
    limits node-bound credentials only), or as it was before the policy: for
    ``holder``'s Node and owned by it, labelled with ``pool`` so that every route keeper
    of the pool sees it, stating ``stated_pool`` (default: the pool)."""
    uid = cluster.kubectl_json("get", "node", holder.name)["metadata"]["uid"]
    net = ipaddress.IPv4Network
    obj = prefixclaims.claim_object(net(prefix), net(pool), holder.name, uid, "forged")
    obj["spec"]["pool"] = stated_pool or pool
    return obj


def metric_becomes(node: SimNode, name: str, value: float) -> None:
    """Wait for the value (one rendering of /metrics serves a second of scrapes)."""

    def check() -> bool:
        assert node_metric(node, name) == value, f"{name} {node_metric(node, name)}"
        return True

    eventually(check, f"{node.name}: {name} {value}", timeout=30)


def reported(node: SimNode, prefixes: list[str]) -> bool:
    lines = [line for line in node.log().splitlines() if "is refused" in line]
    return all(any(f"no route to {p}: " in line for line in lines) for p in prefixes)


def test_prefix_claims_that_are_no_block_of_the_pool_are_never_routed(
    nodes: list[SimNode], pods: PodNamespaces, k8s_control_plane: Cluster
) -> None:
    """PrefixClaims that exist although the admission policy refuses them to nodes (an
    administrator wrote them, or they predate it), each for a node that exists: first
    those that would divert traffic (the cloud metadata address, an eighth of the
    address space, a /28 beside the pool, a /29 in it, a /28 of it stating another
    pool), then those that would take routes or addresses away (the node network, the
    whole pool, a block over the pool naming the observing node itself). No agent
    routes one, adopts one as its own block or counts one as taken: a new pod gets an
    address of a proper block of its own node's, and the pods of the two nodes reach
    each other. Each is reported (log, sluice_node_route_problems,
    sluice_ipam_claims_refused) until it is deleted."""
    cluster = k8s_control_plane
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRD))
    cidrs = list(CLUSTER.subnets(new_prefix=24))
    pool = cidrs[101]
    first, second = nodes[0], nodes[1]
    for node in (first, second):
        node.stop_agent()
        node.ipam = prefix_ipam(str(pool), node.name, warmPrefixes=0, cooldownSeconds=0)
        node.kubeconfig = cluster.kubeconfig  # the claims' writes are granted apart
        node.agent_args = ("--metrics-address", f"127.0.0.1:{METRICS_PORT}")
    for node in (first, second):
        node.start_agent(node.routing)
    for node in (first, second):
        wait_for_routes(node, {}, "no route while nobody holds a prefix of the pool")
    server_ns, client_ns = pods.new(), pods.new()
    server_ip = second.add_pod(server_ns, "server-forged")
    client_ip = ""
    try:
        blocks_28 = list(pool.subnets(new_prefix=28))
        diverting = [
            forged_claim(cluster, "169.254.169.254/32", second, str(pool)),
            forged_claim(cluster, "0.0.0.0/5", second, str(pool)),
            forged_claim(cluster, str(next(cidrs[102].subnets(new_prefix=28))), second, str(pool)),
            forged_claim(cluster, str(list(pool.subnets(new_prefix=29))[-1]), second, str(pool)),
            forged_claim(cluster, str(blocks_28[8]), second, str(pool), str(cidrs[103])),
        ]
        denying = [
            forged_claim(cluster, str(NODE_NET), second, str(pool)),
            forged_claim(cluster, str(pool), second, str(pool)),
            forged_claim(cluster, str(pool.supernet(new_prefix=23)), first, str(pool)),
        ]
        names = [o["metadata"]["name"] for o in (*diverting, *denying)]
        (legit,) = claims_by_node(cluster, str(pool))[second.name]
        wait_for_routes(first, {legit: second.address}, "the route to node 2's block")
        baseline = node_metric(first, "sluice_node_route_problems")
        try:
            for phase, forged in (("diverting", diverting), ("denying", denying)):
                apply(cluster, *forged)
                prefixes = [o["spec"]["prefix"] for o in forged]
                for node in (first, second):

                    def seen(n: SimNode = node, p: list[str] = prefixes) -> bool:
                        assert reported(n, p), f"not all reported; routes {n.route_gateways()}"
                        return True

                    eventually(seen, f"{node.name}: the {phase} claims reported")
                assert first.route_gateways() == {legit: second.address}, f"{phase}: routed"
                assert second.route_gateways() == {}, f"{phase}: routed"
            metric_becomes(first, "sluice_node_route_problems", baseline + len(names))

            # Nothing adopted nor taken: a pod on node 1 gets an address of a /28 of the
            # pool that node 1 claims, routed on node 2 and reached from node 1's pod.
            client_ip = first.add_pod(client_ns, "client-forged")
            ours = [b for b in claims_by_node(cluster, str(pool))[first.name]
                    if ipaddress.IPv4Network(b).prefixlen == 28]  # fmt: skip
            assert len(ours) == 1, ours
            assert ipaddress.IPv4Address(client_ip) in ipaddress.IPv4Network(ours[0]), client_ip
            wait_for_routes(second, {ours[0]: first.address}, "the route to node 1's block")
            assert first.route_gateways() == {legit: second.address}
            metric_becomes(first, "sluice_ipam_claims_refused", len(names))
            server = Server(server_ns)
            try:
                assert eventually(lambda: tcp_reaches(client_ns, server_ip), "TCP to node 2")
                assert server.sources() == {("tcp", client_ip)}
            finally:
                server.stop()
        finally:
            for name in names:
                cluster.kubectl("delete", "prefixclaim", name, "--ignore-not-found")
        metric_becomes(first, "sluice_node_route_problems", baseline)  # gone with them
        metric_becomes(first, "sluice_ipam_claims_refused", 0)
    finally:
        if client_ip:
            first.delete_pod(client_ns, "client-forged")
        second.delete_pod(server_ns, "server-forged")
    eventually(lambda: not claims_by_node(cluster, str(pool)), "the claims released", timeout=120)
    for node in (first, second):
        wait_for_routes(node, {}, "the released blocks' routes gone")
