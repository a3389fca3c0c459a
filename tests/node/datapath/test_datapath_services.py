"""Egress policy through Services, with kube-proxy's DNAT as kube-proxy writes it.

Pods a, b, c on one network (no masquerading, so the node forwards pod
addresses as they are); a may reach only b's pod address on port 8080.
Services are iptables nat rules in kube-proxy's shape: a services chain
jumped from PREROUTING and OUTPUT, one chain per Service matching its
ClusterIP and port, statistic-random choice between endpoint chains, each
DNATing to a backend and marking hairpin traffic for masquerading. A
"remote" backend lives in a namespace standing in for another node, reached
through a veth that plays the node's uplink (with the uplink program, or, as
any other device a flow can leave by, without it); a "hostNetwork" backend
listens on the node itself. after_nat is on netfilter's hooks throughout, as
the agent puts it; without it flows to ClusterIPs are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cni.datapath import after_nat, loader
from cni.datapath import policy_install as P
from cni.datapath.maps import Datapath
from cni.datapath.uplink import attach_uplink, detach_uplink
from cni.net.netlink import Rtnl
from cni.policy.vocabulary import AllowRule, EndpointPolicy, PeerCIDR, Ports
from tests.harness.cni_run import (
    SESSION_TAG,
    TEST_BPF_DIR,
    Network,
    PodNamespaces,
    in_netns,
)
from tests.harness.datapath_pods import PROBE, PYTHON, HeldConnection, Pod, Server, wired_pods
from tests.harness.kube_proxy import KubeProxy, NftKubeProxy


@dataclass
class Remote:
    """A namespace standing in for another node, behind the veth ``uplink``."""

    netns: str
    uplink: str
    backend: str
    node_address: str  # the node's own address on the uplink


@pytest.fixture(params=["iptables", "nftables"])
def kube_proxy(request: pytest.FixtureRequest) -> Iterator[KubeProxy | NftKubeProxy]:
    """kube-proxy's Services, in its iptables mode and in its nftables mode."""
    tag = f"{SESSION_TAG}{random.randint(0, 0xFFF):03x}".upper()
    rules = KubeProxy(tag) if request.param == "iptables" else NftKubeProxy(tag)
    try:
        rules.setup()
        yield rules
    finally:
        rules.cleanup()


@pytest.fixture
def cluster(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    with wired_pods(network, pods, "abc", network.config(ipMasq=False)) as made:
        yield made


@pytest.fixture
def remote(pods: PodNamespaces) -> Iterator[Remote]:
    """10.250.N.7 on the far side of a veth whose node end is the uplink."""
    with far_side(pods, uplink_program=True) as made:
        yield made


@pytest.fixture
def bare_remote(pods: PodNamespaces) -> Iterator[Remote]:
    """The same behind a device without the uplink program."""
    with far_side(pods, uplink_program=False) as made:
        yield made


@contextlib.contextmanager
def far_side(pods: PodNamespaces, uplink_program: bool) -> Iterator[Remote]:
    n = random.randint(0, 255)
    netns = pods.new()
    name = f"slt{SESSION_TAG}up"
    node_side, far_side, backend = f"10.251.{n}.1", f"10.251.{n}.2", f"10.250.{n}.7"
    try:
        for command in (
            ["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", netns],
            ["ip", "addr", "add", f"{node_side}/30", "dev", name],
            ["ip", "link", "set", name, "up"],
            ["ip", "route", "add", f"10.250.{n}.0/24", "via", far_side, "dev", name],
        ):
            subprocess.run(command, check=True)
        for command in (
            ["ip", "addr", "add", f"{far_side}/30", "dev", "eth0"],
            ["ip", "addr", "add", f"{backend}/32", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "route", "add", "default", "via", node_side],
        ):
            in_netns(netns, *command, check=True)
        if uplink_program:
            with Rtnl() as ipr, Datapath(TEST_BPF_DIR) as datapath:
                attach_uplink(datapath, ipr, name)
        yield Remote(netns, name, backend, node_side)
    finally:
        with Rtnl() as ipr, Datapath(TEST_BPF_DIR) as datapath, contextlib.suppress(OSError):
            detach_uplink(datapath, ipr, name)
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


@pytest.fixture
def dp() -> Iterator[Datapath]:
    """The test datapath with after_nat on netfilter's hooks, as the agent puts it."""
    with Datapath(TEST_BPF_DIR) as datapath:
        after_nat.attach(datapath)
        try:
            yield datapath
        finally:
            after_nat.detach(datapath)
            datapath.network.set_service_ips([])


def only_b(b: Pod, *more: str) -> EndpointPolicy:
    peers = [AllowRule(peers=(PeerCIDR(f"{b.ip}/32"),), ports=(Ports("tcp", 8080),))]
    peers += [AllowRule(peers=(PeerCIDR(f"{ip}/32"),), ports=(Ports("tcp", 8080),))
              for ip in more]  # fmt: skip
    return EndpointPolicy(egress=tuple(peers))


def connects(pod: Pod, address: str, port: int = 80) -> bool:
    return in_netns(pod.netns, PYTHON, PROBE, "connect", address, str(port)).returncode == 0


def cluster_ip() -> str:
    return f"10.96.{random.randint(0, 255)}.{random.randint(1, 254)}"


def test_egress_through_a_service_is_judged_on_its_backend(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath
) -> None:
    a, b, c = cluster
    web, only_c, own = cluster_ip(), cluster_ip(), cluster_ip()
    kube_proxy.service("WEB", web, [(b.ip, 8080), (c.ip, 8080)])
    kube_proxy.service("C", only_c, [(c.ip, 8080)])
    kube_proxy.service("A", own, [(a.ip, 8080)])
    dp.network.set_service_ips([web, only_c, own])
    P.install(dp, a.ifindex, only_b(b))
    before = dp.counters()["egress"]["denied-policy"]
    with Server(b, tcp=(8080,)) as at_b, Server(c, tcp=(8080,)) as at_c, Server(a, tcp=(8080,)):
        # At least 12 tries, and on until one goes to c: 12 tries all landed on b
        # twice in some forty runs (1 in 4096 were the choice fair).
        outcomes: list[bool] = []
        while len(outcomes) < 12 or (all(outcomes) and len(outcomes) < 40):
            outcomes.append(connects(a, web))
        assert not connects(a, only_c), "c through its ClusterIP"
        assert connects(a, own), "hairpin: a reaches itself through its own Service"
    assert at_c.counts["tcp"]["8080"] == 0
    assert at_b.counts["tcp"]["8080"] == sum(outcomes) >= 1, "replies flow back through DNAT"
    assert not all(outcomes), "the backends chosen at random include c"
    denied = dp.counters()["egress"]["denied-policy"] - before
    assert denied >= len(outcomes) - sum(outcomes) + 1, "counted as a's egress denials"


def test_a_tightened_policy_cuts_an_established_service_flow(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath
) -> None:
    a, b, _ = cluster
    svc = cluster_ip()
    kube_proxy.service("B", svc, [(b.ip, 8080)])
    dp.network.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    with Server(b, tcp=(8080,)):
        held = HeldConnection(a, Pod("svc", "", svc, "", 0), 80)
        P.install(dp, a.ifindex, EndpointPolicy(egress=()))
        assert held.finish() == "cut"


@pytest.mark.parametrize("restarted", [False, True], ids=["attached", "attached-again"])
def test_a_remote_backend_is_judged_at_the_uplink(
    cluster: list[Pod],
    kube_proxy: KubeProxy | NftKubeProxy,
    dp: Datapath,
    remote: Remote,
    restarted: bool,
) -> None:
    """``attached-again``: a restarted agent attaches the uplink program once more
    (its pinned link outlived the agent); the kernel refuses a second link of one
    program on one hook, so the earlier link is adopted, and it still judges."""
    a, b, _ = cluster
    if restarted:
        with Rtnl() as ipr, Datapath(TEST_BPF_DIR) as again:
            attach_uplink(again, ipr, remote.uplink)
            attach_uplink(again, ipr, remote.uplink)
    svc = cluster_ip()
    kube_proxy.service("R", svc, [(remote.backend, 8080)])
    dp.network.set_service_ips([svc])
    server = subprocess.Popen(
        ["ip", "netns", "exec", remote.netns.rsplit("/", 1)[1], PYTHON, PROBE, "serve",
         "--tcp", "8080"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        P.install(dp, a.ifindex, only_b(b))
        assert connects(a, remote.backend, 8080) is False, "direct, judged where a sends it"
        assert not connects(a, svc), "through the Service, judged at the uplink"
        P.install(dp, a.ifindex, only_b(b, remote.backend))
        assert connects(a, svc)
        assert connects(a, remote.backend, 8080)
    finally:
        server.communicate("", timeout=20)


def serve_in(netns: str | None, port: int) -> subprocess.Popen[str]:
    """netprobe serve on TCP ``port``, in ``netns`` or (None) on the node itself."""
    prefix = ["ip", "netns", "exec", netns.rsplit("/", 1)[1]] if netns else []
    server = subprocess.Popen(
        [*prefix, PYTHON, PROBE, "serve", "--tcp", str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


def accepted(server: subprocess.Popen[str], port: int) -> int:
    out, _ = server.communicate("", timeout=20)
    return int(json.loads(out)["tcp"].get(str(port), 0))


def masquerading(uplink: str) -> contextlib.AbstractContextManager[None]:
    """What ipMasq and kube-proxy do to flows for addresses outside the cluster: the
    node's address as their source, before the uplink's program sees them."""
    return iptables_nat(["POSTROUTING", "-o", uplink, "-j", "MASQUERADE"])


@pytest.mark.parametrize("masquerade", [False, True], ids=["routed", "masqueraded"])
def test_a_backend_behind_any_device_is_judged_after_dnat(
    cluster: list[Pod],
    kube_proxy: KubeProxy | NftKubeProxy,
    dp: Datapath,
    bare_remote: Remote,
    masquerade: bool,
) -> None:
    """The flow leaves by a device without the uplink program, as it may on a node with
    several interfaces, and (``masqueraded``) with the node's source, as it does to an
    address outside the cluster: judged on netfilter's FORWARD hook all the same."""
    a, b, _ = cluster
    svc = cluster_ip()
    kube_proxy.service("M", svc, [(bare_remote.backend, 8080)])
    dp.network.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    before = dp.counters()["egress"]["denied-policy"]
    with masquerading(bare_remote.uplink) if masquerade else contextlib.nullcontext():
        server = serve_in(bare_remote.netns, 8080)
        try:
            assert not connects(a, svc), "through the Service, to a backend a may not reach"
        finally:
            reached = accepted(server, 8080)
        assert reached == 0, f"{reached} connections reached the denied backend"
        assert dp.counters()["egress"]["denied-policy"] > before, "counted as a's denial"
        P.install(dp, a.ifindex, only_b(b, bare_remote.backend))
        server = serve_in(bare_remote.netns, 8080)
        try:
            assert connects(a, svc), "allowed: through the Service"
        finally:
            assert accepted(server, 8080) >= 1


def test_a_host_network_backend_is_judged_after_dnat(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath, bare_remote: Remote
) -> None:
    """A Service whose backend is the node itself (a hostNetwork pod, the API server):
    the flow never leaves by a device, and is judged on netfilter's LOCAL_IN hook."""
    a, b, _ = cluster
    port = random.randint(20000, 29999)
    node = bare_remote.node_address
    svc = cluster_ip()
    kube_proxy.service("H", svc, [(node, port)])
    dp.network.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    server = serve_in(None, port)
    try:
        assert not connects(a, svc), "through the Service, to the node a may not reach"
    finally:
        reached = accepted(server, port)
    assert reached == 0, f"{reached} connections reached the node"
    allow_node = AllowRule(peers=(PeerCIDR(f"{node}/32"),), ports=(Ports("tcp", port),))
    P.install(dp, a.ifindex, EndpointPolicy(egress=(*only_b(b).egress, allow_node)))
    server = serve_in(None, port)
    try:
        assert connects(a, svc), "allowed: through the Service"
    finally:
        assert accepted(server, port) >= 1


@contextlib.contextmanager
def iptables_nat(*rules: list[str]) -> Iterator[None]:
    """``iptables -t nat -I`` each rule (chain first), removed on the way out."""
    tag = ["-m", "comment", "--comment", f"sluice-test-{SESSION_TAG}"]
    added: list[list[str]] = []
    try:
        for rule in rules:
            subprocess.run(["iptables", "-t", "nat", "-I", *rule, *tag], check=True)
            added.append(rule)
        yield
    finally:
        for rule in reversed(added):
            subprocess.run(["iptables", "-t", "nat", "-D", *rule, *tag], check=False)


def test_an_egress_isolated_backend_answers_masqueraded_clients(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath, bare_remote: Remote
) -> None:
    """A pod that may open no flow still answers what reaches it through a Service,
    masqueraded as kube-proxy masquerades the node's own connections to a ClusterIP and
    a NodePort's clients. On netfilter's hooks those answers' addresses are half
    translated (the masquerade undone, the DNAT not yet): no conntrack key of the pod's
    names them, and they were judged as the pod's new flows and dropped."""
    a, b, _ = cluster
    svc, node_port = cluster_ip(), random.randint(30000, 32767)
    kube_proxy.service("R", svc, [(b.ip, 8080)])
    dp.network.set_service_ips([svc])
    P.install(dp, b.ifindex, EndpointPolicy(egress=()))
    to_b = ["-d", f"{b.ip}/32", "-p", "tcp", "--dport", "8080"]
    with (
        iptables_nat(
            ["POSTROUTING", *to_b, "-j", "MASQUERADE"],
            ["PREROUTING", "-d", f"{bare_remote.node_address}/32", "-p", "tcp",
             "--dport", str(node_port), "-j", "DNAT", "--to-destination", f"{b.ip}:8080"],
        ),
        Server(b, tcp=(8080,)) as at_b,
        Server(a, tcp=(8080,)) as at_a,
    ):  # fmt: skip
        from_node = subprocess.run(
            [PYTHON, PROBE, "connect", svc, "80"], capture_output=True, timeout=20, check=False
        )
        from_outside = in_netns(
            bare_remote.netns, PYTHON, PROBE, "connect", bare_remote.node_address, str(node_port)
        )
        assert not connects(b, a.ip, 8080), "b opens no flow: its policy holds"
    assert from_node.returncode == 0, "the node through the ClusterIP"
    assert from_outside.returncode == 0, "another host through the NodePort"
    assert at_b.counts["tcp"]["8080"] == 2
    assert at_a.counts["tcp"].get("8080", 0) == 0


def test_without_after_nat_flows_to_cluster_ips_are_refused(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath
) -> None:
    """Fail closed: off netfilter's hooks (a kernel without netfilter programs, an agent
    that could not attach), an egress-isolated pod's flow to a ClusterIP is dropped
    where the pod sends it, even to a backend its policy allows."""
    a, b, _ = cluster
    svc = cluster_ip()
    kube_proxy.service("F", svc, [(b.ip, 8080)])
    dp.network.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    with Server(b, tcp=(8080,)):
        assert connects(a, svc)
        after_nat.detach(dp)
        before = dp.counters()["egress"]["drop-unjudged"]
        assert not connects(a, svc)
        assert dp.counters()["egress"]["drop-unjudged"] > before
        assert connects(a, b.ip, 8080), "direct flows are judged where a sends them"
        after_nat.attach(dp)
        assert connects(a, svc)


def test_after_nat_beside_another_datapath_and_across_a_reload(dp: Datapath) -> None:
    """The kernel takes one BPF program per netfilter hook and priority: a second
    datapath on the node (another network) and the new program of a reload each get
    a priority of their own, and judge."""
    other_dir = f"{TEST_BPF_DIR}-other"
    assert loader.load(other_dir, force=True)
    try:
        with Datapath(other_dir) as other:
            after_nat.attach(other)
            assert after_nat.attached(other) == list(after_nat.HOOKS)
            assert other.config().after_nat == 1
        assert after_nat.attached(dp) == list(after_nat.HOOKS), "the first one stays"
        assert loader.load(TEST_BPF_DIR, force=True)  # a new program, new links
        assert after_nat.attached(dp) == list(after_nat.HOOKS)
        assert dp.config().after_nat == 1
    finally:
        shutil.rmtree(other_dir, ignore_errors=True)


def test_after_nat_loads_where_kernel_addresses_read_as_zero() -> None:
    """The DaemonSet's agent has no CAP_SYSLOG, so /proc/kallsyms gives it every address
    as 0; bcc then took bpf_probe_read_kernel for missing and compiled the old
    bpf_probe_read, which the kernel refuses netfilter programs: no after_nat, and
    every egress-isolated pod's Service flow refused."""
    bpf_dir = f"{TEST_BPF_DIR}-nosyslog"
    script = "import sys; from cni.datapath import loader; loader.load(sys.argv[1], force=True)"
    try:
        proc = subprocess.run(
            ["setpriv", "--bounding-set", "-syslog", sys.executable, "-c", script, bpf_dir],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert os.path.exists(os.path.join(bpf_dir, after_nat.PROGRAM)), proc.stderr[-2000:]
        with Datapath(bpf_dir) as other:
            after_nat.attach(other)
            assert after_nat.attached(other) == list(after_nat.HOOKS)
    finally:
        shutil.rmtree(bpf_dir, ignore_errors=True)


UDP_COUNTER = """
import json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(0.2)
print("ready", flush=True)
seen = {}
import select
while True:
    if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
        break
    try:
        data, (ip, _) = s.recvfrom(2048)
    except socket.timeout:
        continue
    seen[ip] = seen.get(ip, 0) + 1
print(json.dumps(seen), flush=True)
"""
UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[3] != "-":
    s.bind((sys.argv[3], int(sys.argv[4])))
for _ in range(5):
    s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.05)
"""


def test_a_flow_to_a_cluster_ip_that_no_dnat_translates_leaves_nowhere(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath, bare_remote: Remote
) -> None:
    """An egress-isolated pod's flow to a ClusterIP passes where the pod sends it, to be
    judged after DNAT. Nothing translates it on a port the Service does not have, nor
    when netfilter takes it for the reply of a connection a host opened from the
    ClusterIP itself: it would leave by the node's route toward that address, to
    whoever holds it (here a host beyond a device, counting what reaches it)."""
    a, b, _ = cluster
    svc = cluster_ip()
    kube_proxy.service("U", svc, [(b.ip, 8080)])  # TCP 80 only
    dp.network.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    in_netns(bare_remote.netns, "ip", "addr", "add", f"{svc}/32", "dev", "eth0", check=True)
    route = ["ip", "route", "add", f"{svc}/32", "dev", bare_remote.uplink]
    subprocess.run(route, check=True)
    far = ["ip", "netns", "exec", bare_remote.netns.rsplit("/", 1)[1], PYTHON]
    try:
        # A "reply": the far side writes from the ClusterIP first (before its counter
        # holds the port), then a answers it.
        subprocess.run([*far, "-c", UDP_SEND, a.ip, "9999", svc, "5353"], check=True, timeout=20)
        counter = subprocess.Popen(
            [*far, "-c", UDP_COUNTER, svc, "5353"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert counter.stdout is not None and counter.stdout.readline().strip() == "ready"
        in_netns(a.netns, PYTHON, "-c", UDP_SEND, svc, "5353", a.ip, "9999", check=True)
        # A port the Service does not have.
        in_netns(a.netns, PYTHON, "-c", UDP_SEND, svc, "5353", "-", "0", check=True)
        out, _ = counter.communicate("", timeout=20)
        reached = json.loads(out.strip().splitlines()[-1])
        assert reached.get(a.ip, 0) == 0, f"{reached[a.ip]} datagrams left untranslated"
        assert dp.counters()["egress"]["drop-unjudged"] >= 10
    finally:
        subprocess.run(["ip", "route", "del", f"{svc}/32"], check=False)
