"""The node network and the tunnel, as an attacker uses them: hostile packets sent for
real, counted at the receiving pod.

Three nodes (network namespaces on one bridge, each with a real agent watching one
control plane; tests/node/agent/test_routes.py has the harness), the uplink programs
on each node's eth0, strict reverse-path filters. On node 1 a victim pod whose
NetworkPolicy admits only the "friend" pod of node 3 (by address); attackers: a pod on node 2, a
pod beside the victim on node 1, node 2 itself (a hostNetwork pod with NET_RAW), and
a host on the node network that is no node ("outsider"). Each forges the friend's
source, and the victim's UDP server counts what it got from the friend's address.

- vxlan: a node reaches pods on other nodes (its traffic leaves from its tunnel
  address, which the receiver routes back through the tunnel); crafted VXLAN
  datagrams from a pod on another node, from a pod on the victim's node, through the
  attacker's own node, and from the outsider (also with a node's address as outer
  source) deliver nothing; real tunnel traffic and a crafted datagram from a real
  peer with its own pod's source still do;
- native: a pod's source forged from another node or from the outsider delivers
  nothing, the friend's own packets do;
- both: a datagram the outsider's kernel fragments, and a SYN in two fragments,
  reassembled on node 1 and fragmented again for the pod, are judged as the
  outsider's (denied), never as the node's own traffic.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni.net import vxlan
from cni.plugin.netconf import DEFAULT_TUNNEL_PORT, DEFAULT_TUNNEL_VNI
from tests.harness.agent import NETPROBE, PYTHON
from tests.harness.claims import apply
from tests.harness.cluster import Cluster
from tests.harness.cni_run import TEST_NETNS_PREFIX, TEST_NETWORK_PREFIX, Network, PodNamespaces
from tests.harness.waiting import eventually
from tests.node.agent.test_routes import (  # noqa: F401 (fixtures)
    BRIDGE,
    BRIDGE_ADDRESS,
    CLUSTER,
    NODE_NET,
    TAG,
    SimNode,
    agent_kubeconfig,
    delete_node_object,
    expected_routes,
    node_network,
    restart_all,
    sh,
    tcp_reaches,
    wait_for_routes,
)

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

FORGED = str(Path(__file__).resolve().parents[2] / "harness" / "forged.py")
UDP_PORT, TCP_PORT = 5000, 8080
SENT = 5  # datagrams per attempt


class GuardedNode(SimNode):
    """A node whose eth0 carries the uplink programs, as on a real node."""

    def plugin_config(self, routing: str) -> dict[str, Any]:
        return {**super().plugin_config(routing), "uplinks": ["eth0"]}


def in_ns(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def forged(netns: str, *args: object) -> subprocess.CompletedProcess[str]:
    return in_ns(netns, PYTHON, FORGED, *map(str, args))


class Counter:
    """netprobe serving UDP 5000 and TCP 8080 in a pod; what it got, by source."""

    def __init__(self, netns: str) -> None:
        self.proc = subprocess.Popen(
            ["nsenter", f"--net={netns}", PYTHON, NETPROBE, "serve",
             "--tcp", str(TCP_PORT), "--udp", str(UDP_PORT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def got(self, proto: str, source: str) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("sources\n")
        self.proc.stdin.flush()
        listed = json.loads(self.proc.stdout.readline())
        return sum(n for p, _, src, n in listed if p == proto and src == source)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Scene:
    nodes: list[GuardedNode]
    cluster: Cluster
    pods: PodNamespaces
    outsider: str  # the netns of a host on the node network that is no node
    outsider_ip: str
    netns: dict[str, str] = field(default_factory=dict)  # role -> pod netns
    ips: dict[str, str] = field(default_factory=dict)
    placed: dict[str, GuardedNode] = field(default_factory=dict)
    counter: Counter | None = None
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:5])

    def pod_name(self, role: str) -> str:
        return f"nn-{role}-{self.suffix}"

    def node_ns(self, node: GuardedNode) -> str:
        return f"/run/netns/{node.netns}"

    def wire(self, role: str, node: GuardedNode) -> None:
        self.netns[role] = self.pods.new()
        self.placed[role] = node
        pod = ("default", self.pod_name(role))
        self.ips[role] = node.add_pod(self.netns[role], f"{role}-{self.suffix}", pod)

    def unwire(self) -> None:
        for role, node in self.placed.items():
            node.delete_pod(
                self.netns[role], f"{role}-{self.suffix}", ("default", self.pod_name(role))
            )
        self.placed.clear()

    def friend_datagrams(self) -> int:
        assert self.counter is not None
        return self.counter.got("udp", self.ips["friend"])


ROLES = {"victim": 0, "open": 0, "neighbour": 0, "attacker": 1, "friend": 2}


@pytest.fixture(scope="module")
def scene(
    k8s_control_plane: Cluster,
    agent_kubeconfig: Path,  # noqa: F811
    node_network: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    bin_dir: Path,
) -> Iterator[Scene]:
    cluster = k8s_control_plane
    pods = PodNamespaces(TEST_NETNS_PREFIX)
    workdir = tmp_path_factory.mktemp("node-network")
    network = Network(
        name=f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}",
        subnet=str(CLUSTER),
        state_dir=workdir / "unused",
        bin_dir=bin_dir,
    )
    nodes: list[GuardedNode] = []
    outsider = f"{TEST_NETNS_PREFIX}nno-{TAG}"
    outsider_ip = str(NODE_NET.network_address + 50)
    scene = None
    try:
        for index in range(1, 4):
            node = GuardedNode(index, cluster, network, workdir / f"n{index}")
            node.workdir.mkdir()
            node.kubeconfig = agent_kubeconfig
            nodes.append(node)
            node.create_namespace()
            for key in ("all", "default", "eth0"):
                node.run("sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=1")
            node.create_node_object()
        _make_outsider(outsider, outsider_ip, nodes[0].address)
        for node in nodes:
            node.start_agent("vxlan")
        for node in nodes:
            wait_for_routes(node, expected_routes(nodes, node), "the routes through the tunnel")
        scene = Scene(nodes, cluster, pods, f"/run/netns/{outsider}", outsider_ip)
        objects = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": scene.pod_name(role),
                    "namespace": "default",
                    "labels": {"nn-role": role},
                },
                "spec": {
                    "nodeName": nodes[i].name,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
            for role, i in ROLES.items()
        ]
        apply(cluster, *objects)
        for role, i in ROLES.items():
            scene.wire(role, nodes[i])
        scene.counter = Counter(scene.netns["victim"])
        apply(
            cluster,
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": f"nn-victim-{scene.suffix}", "namespace": "default"},
                "spec": {
                    "podSelector": {"matchLabels": {"nn-role": "victim"}},
                    "policyTypes": ["Ingress"],
                    # By address: these Pods have no kubelet to report theirs in the API.
                    "ingress": [{"from": [{"ipBlock": {"cidr": f"{scene.ips['friend']}/32"}}]}],
                },
            },
        )
        eventually(
            lambda: not tcp_reaches(scene.netns["attacker"], scene.ips["victim"], timeout=1),
            "the victim's policy in force",
        )
        yield scene
    finally:
        if scene is not None:
            if scene.counter is not None:
                scene.counter.stop()
            scene.unwire()
            cluster.kubectl(
                "delete",
                "networkpolicy",
                "-n",
                "default",
                f"nn-victim-{scene.suffix}",
                "--ignore-not-found",
            )
            for role in ROLES:
                cluster.kubectl(
                    "delete",
                    "pod",
                    "-n",
                    "default",
                    scene.pod_name(role),
                    "--ignore-not-found",
                    "--grace-period=0",
                    "--force",
                )
        sh("ip", "netns", "del", outsider, check=False)
        sh("ip", "link", "del", f"nno{TAG}", check=False)
        pods.cleanup()
        for node in nodes:
            node.cleanup()
        for node in nodes:
            delete_node_object(cluster, node.name)


def _make_outsider(netns: str, address: str, via: str) -> None:
    """A host on the node network that is no node, with a route to the pods via node 1."""
    host_end = f"nno{TAG}"
    sh("ip", "netns", "add", netns)
    sh("ip", "link", "add", host_end, "type", "veth", "peer", "eth0", "netns", netns)
    sh("ip", "link", "set", host_end, "master", BRIDGE, "up")
    for argv in (
        ("ip", "link", "set", "lo", "up"),
        ("ip", "addr", "add", f"{address}/{NODE_NET.prefixlen}", "dev", "eth0"),
        ("ip", "link", "set", "eth0", "up"),
        ("ip", "route", "add", str(CLUSTER), "via", via),
    ):
        sh("ip", "netns", "exec", netns, *argv)


def vtep_mac(node: GuardedNode) -> str:
    return vxlan.vtep_mac(ipaddress.IPv4Address(node.address))


def send_vxlan(
    scene: Scene, netns: str, to: GuardedNode, inner_src: str, outer_src: str | None = None
) -> None:
    """SENT crafted VXLAN datagrams to node ``to``: the victim (on node 1) as inner
    destination, ``inner_src`` as inner source; the inner frame to ``to``'s tunnel MAC
    (so that ``to`` takes it in and routes it on) from node 3's (what node 3's own
    tunnel traffic carries)."""
    args: list[object] = [
        to.address, DEFAULT_TUNNEL_PORT, DEFAULT_TUNNEL_VNI, vtep_mac(to),
        vtep_mac(scene.nodes[2]), inner_src, scene.ips["victim"], UDP_PORT, SENT,
    ]  # fmt: skip
    if outer_src is not None:
        args.append(outer_src)
    forged(netns, "vxlan", *args)


def diagnose(scene: Scene) -> str:
    """What node 1's datapath counted and holds, for a failure's message."""
    from cni.datapath.maps import Datapath

    first = scene.nodes[0]
    with Datapath(first.bpf_dir) as datapath:
        counters = {d: {r: n for r, n in c.items() if n} for d, c in datapath.counters().items()}
        ranges = datapath.network.pod_ranges()
        peers = datapath.network.tunnel_peers()
        config = datapath.config()
    neigh = first.run("ip", "-d", "neigh").stdout
    return (
        f"counters {counters}\nranges {ranges}\npeers {peers}\n"
        f"tunnel port {config.tunnel_port} vni {config.tunnel_vni}\nneighbours:\n{neigh}"
    )


def arrived(scene: Scene, send: Any, what: str) -> int:
    """Datagrams from the friend's address the victim got while ``send()`` ran."""
    import time

    before = scene.friend_datagrams()
    send()
    time.sleep(1.0)
    got = scene.friend_datagrams() - before
    print(f"{what}: {got} of {SENT} arrived")
    return got


# -- vxlan -------------------------------------------------------------------------------


@pytest.mark.parametrize("rp_filter", [1, 2])
def test_a_node_reaches_pods_on_other_nodes_through_the_tunnel(
    scene: Scene, rp_filter: int
) -> None:
    for node in scene.nodes:
        for key in ("all", "eth0"):
            node.run("sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter={rp_filter}")
    server = Counter(scene.netns["open"])
    try:
        for node in scene.nodes[1:]:
            assert tcp_reaches(scene.node_ns(node), scene.ips["open"]), (
                f"{node.name} does not reach a pod on node 1 (rp_filter {rp_filter})"
            )
            # From its tunnel address: the network address of its own pod range.
            tunnel_address = str(ipaddress.IPv4Network(node.pod_cidr).network_address)
            assert server.got("tcp", tunnel_address) >= 1, f"not from {tunnel_address}"
    finally:
        server.stop()
        for node in scene.nodes:
            for key in ("all", "eth0"):
                node.run("sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=1")


def test_crafted_vxlan_delivers_nothing_from_pods_or_the_node_network(scene: Scene) -> None:
    first, second, third = scene.nodes
    friend = scene.ips["friend"]
    real = arrived(
        scene,
        lambda: in_ns(
            scene.netns["friend"],
            PYTHON,
            NETPROBE,
            "udp",
            scene.ips["victim"],
            str(UDP_PORT),
            "--count",
            str(SENT),
        ),
        "the friend's own datagrams through the tunnel",
    )
    assert real == SENT, diagnose(scene)
    attempts = {
        "from a pod on another node": lambda: send_vxlan(
            scene, scene.netns["attacker"], first, friend
        ),
        "from a pod on the victim's node": lambda: send_vxlan(
            scene, scene.netns["neighbour"], first, friend
        ),
        "through the attacker's own node": lambda: send_vxlan(
            scene, scene.netns["attacker"], second, friend
        ),
        "from a host on the node network": lambda: send_vxlan(scene, scene.outsider, first, friend),
        "from a host on the node network with node 3's address": lambda: send_vxlan(
            scene, scene.outsider, first, friend, outer_src=third.address
        ),
        "from node 2 with node 3's pod as inner source": lambda: send_vxlan(
            scene, scene.node_ns(second), first, friend
        ),
    }
    leaked = {what: arrived(scene, send, what) for what, send in attempts.items()}
    assert leaked == dict.fromkeys(attempts, 0), leaked
    peer = arrived(
        scene,
        lambda: send_vxlan(scene, scene.node_ns(third), first, friend),
        "a crafted datagram from node 3 with its own pod's source",
    )
    assert peer == SENT


# -- fragments made again by the node (both modes) ------------------------------------------


def refragmented_reach(scene: Scene, role: str, counter: Counter) -> dict[str, int]:
    """From the outsider: a 3000-byte datagram its kernel fragments, and a SYN in two
    fragments; node 1 reassembles both (its conntrack does) and fragments them again on
    their way into the pod ``role``. What reached the pod."""
    import time

    target, outsider = scene.ips[role], scene.outsider_ip
    before = counter.got("udp", outsider)
    capture = subprocess.Popen(
        ["nsenter", f"--net={scene.netns[role]}", PYTHON, FORGED, "count-syns", "eth0",
         outsider, str(TCP_PORT), "3"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)
    forged(scene.outsider, "big-udp", target, UDP_PORT, 3000)
    for _ in range(3):
        forged(scene.outsider, "fragmented-syn", target, TCP_PORT)
    out, _ = capture.communicate(timeout=30)
    syns, fragments = map(int, out.split())
    time.sleep(0.5)
    got = {
        "datagram": counter.got("udp", outsider) - before,
        "SYNs": syns,
        "fragments": fragments,
    }
    print(f"refragmented, into {role}: {got}")
    return got


def assert_refragmented_packets_are_judged_as_the_senders(scene: Scene) -> None:
    """Into a pod no policy isolates they arrive (fragmented again); into the victim,
    whose policy denies the outsider, nothing does."""
    assert scene.counter is not None
    server = Counter(scene.netns["open"])
    try:
        control = refragmented_reach(scene, "open", server)
    finally:
        server.stop()
    assert control["datagram"] == 1 and control["SYNs"] >= 1 and control["fragments"] >= 2, control
    got = refragmented_reach(scene, "victim", scene.counter)
    assert got == {"datagram": 0, "SYNs": 0, "fragments": 0}, got


def test_refragmented_packets_are_their_senders_through_the_tunnel_mode(scene: Scene) -> None:
    assert_refragmented_packets_are_judged_as_the_senders(scene)


# -- native ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native(scene: Scene) -> Scene:
    restart_all(scene.nodes, "native")  # type: ignore[arg-type]
    for node in scene.nodes:
        wait_for_routes(node, expected_routes(scene.nodes, node), "native routes")  # type: ignore[arg-type]
    return scene


def test_forged_pod_sources_from_the_node_network_deliver_nothing(native: Scene) -> None:
    scene = native
    second = scene.nodes[1]
    friend, victim = scene.ips["friend"], scene.ips["victim"]
    real = arrived(
        scene,
        lambda: in_ns(
            scene.netns["friend"],
            PYTHON,
            NETPROBE,
            "udp",
            victim,
            str(UDP_PORT),
            "--count",
            str(SENT),
        ),
        "the friend's own datagrams",
    )
    assert real == SENT
    attempts = {
        "node 2 (a hostNetwork pod with NET_RAW) with the friend's source": lambda: forged(
            scene.node_ns(second), "udp", friend, victim, UDP_PORT, SENT
        ),
        "a host on the node network with the friend's source": lambda: forged(
            scene.outsider, "udp", friend, victim, UDP_PORT, SENT
        ),
    }
    leaked = {what: arrived(scene, send, what) for what, send in attempts.items()}
    assert leaked == dict.fromkeys(attempts, 0), leaked


def test_refragmented_packets_are_their_senders_in_native_mode(native: Scene) -> None:
    assert_refragmented_packets_are_judged_as_the_senders(native)
