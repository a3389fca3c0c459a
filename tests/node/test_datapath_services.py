"""Egress policy through Services, with kube-proxy's DNAT as kube-proxy writes it.

Pods a, b, c on one network (no masquerading, so the node forwards pod
addresses as they are); a may reach only b's pod address on port 8080.
Services are iptables nat rules in kube-proxy's shape: a services chain
jumped from PREROUTING and OUTPUT, one chain per Service matching its
ClusterIP and port, statistic-random choice between endpoint chains, each
DNATing to a backend and marking hairpin traffic for masquerading. A
"remote" backend lives in a namespace standing in for another node, reached
through a veth that plays the node's uplink.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from cni.datapath import endpoint
from cni.datapath import policy as P
from cni.datapath.maps import Datapath
from cni.net.netlink import Rtnl
from tests.node.test_datapath import PROBE, PYTHON, HeldConnection, Pod, Server
from tests.support.cni_run import (
    SESSION_TAG,
    TEST_BPF_DIR,
    Network,
    PodNamespaces,
    in_netns,
    node_veth,
)

MARK = "0x4000/0x4000"


@dataclass
class KubeProxy:
    """iptables nat rules in kube-proxy's shape, removed by ``cleanup``."""

    tag: str
    services: dict[str, tuple[str, int, list[tuple[str, int]]]] = field(default_factory=dict)
    nat_existed: bool = True

    @property
    def top(self) -> str:
        return f"KUBE-SERVICES-{self.tag}"

    @property
    def post(self) -> str:
        return f"KUBE-POSTROUTING-{self.tag}"

    @property
    def mark(self) -> str:
        return f"KUBE-MARK-MASQ-{self.tag}"

    def ipt(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["iptables", "-w", "-t", "nat", *args], capture_output=True, text=True, check=check
        )

    def setup(self) -> None:
        self.nat_existed = (
            subprocess.run(["nft", "list", "table", "ip", "nat"], capture_output=True).returncode
            == 0
        )
        for chain in (self.top, self.post, self.mark):
            self.ipt("-N", chain)
        self.ipt("-A", self.mark, "-j", "MARK", "--set-xmark", MARK)
        self.ipt("-A", self.post, "-m", "mark", "!", "--mark", MARK, "-j", "RETURN")
        self.ipt("-A", self.post, "-j", "MARK", "--set-xmark", "0x4000/0")
        self.ipt("-A", self.post, "-j", "MASQUERADE", "--random-fully")
        self.ipt("-I", "PREROUTING", "-j", self.top)
        self.ipt("-I", "OUTPUT", "-j", self.top)
        self.ipt("-I", "POSTROUTING", "-j", self.post)

    def service(self, name: str, cluster_ip: str, backends: list[tuple[str, int]]) -> None:
        svc = f"KUBE-SVC-{self.tag}-{name}"
        self.ipt("-N", svc)
        self.ipt("-A", self.top, "-d", f"{cluster_ip}/32", "-p", "tcp", "--dport", "80",
                 "-j", svc)  # fmt: skip
        for i, (ip, port) in enumerate(backends):
            sep = f"KUBE-SEP-{self.tag}-{name}{i}"
            self.ipt("-N", sep)
            self.ipt("-A", sep, "-s", f"{ip}/32", "-j", self.mark)
            self.ipt("-A", sep, "-p", "tcp", "-j", "DNAT", "--to-destination", f"{ip}:{port}")
            left = len(backends) - i
            if left > 1:
                self.ipt("-A", svc, "-m", "statistic", "--mode", "random", "--probability",
                         f"{1 / left:.5f}", "-j", sep)  # fmt: skip
            else:
                self.ipt("-A", svc, "-j", sep)
        self.services[name] = (cluster_ip, 80, backends)

    def cleanup(self) -> None:
        for hook, chain in (("PREROUTING", self.top), ("OUTPUT", self.top),
                            ("POSTROUTING", self.post)):  # fmt: skip
            while self.ipt("-D", hook, "-j", chain, check=False).returncode == 0:
                pass
        listed = self.ipt("-S", check=False).stdout.split()
        ours = sorted({w for w in listed if w.endswith(self.tag) or f"-{self.tag}-" in w})
        for chain in ours:
            self.ipt("-F", chain, check=False)
        for chain in ours:
            self.ipt("-X", chain, check=False)
        if not self.nat_existed:
            rules = self.ipt("-S", check=False).stdout.splitlines()
            if all(line.startswith("-P ") for line in rules):
                subprocess.run(["nft", "delete", "table", "ip", "nat"], check=False)


@dataclass
class NftKubeProxy:
    """The same Services as kube-proxy's nftables mode writes them, in a table of their
    own (``cleanup`` deletes it)."""

    tag: str

    @property
    def table(self) -> str:
        return f"slt-kube-proxy-{self.tag.lower()}"

    def nft(self, script: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)

    def setup(self) -> None:
        self.nft(
            f"""table ip {self.table} {{
  chain mark-for-masquerade {{ meta mark set meta mark | 0x4000; }}
  chain masquerading {{
    meta mark & 0x4000 == 0 return
    meta mark set meta mark ^ 0x4000
    masquerade fully-random
  }}
  chain services {{ }}
  chain nat-prerouting {{ type nat hook prerouting priority dstnat; jump services; }}
  chain nat-output {{ type nat hook output priority -100; jump services; }}
  chain nat-postrouting {{ type nat hook postrouting priority srcnat; jump masquerading; }}
}}"""
        )

    def service(self, name: str, cluster_ip: str, backends: list[tuple[str, int]]) -> None:
        t, svc = self.table, f"service-{name.lower()}"
        lines = [f"add chain ip {t} {svc}"]
        for i, (ip, port) in enumerate(backends):
            ep = f"endpoint-{name.lower()}-{i}"
            lines += [
                f"add chain ip {t} {ep}",
                f"add rule ip {t} {ep} ip saddr {ip} jump mark-for-masquerade",
                f"add rule ip {t} {ep} meta l4proto tcp dnat to {ip}:{port}",
            ]
        choices = ", ".join(f"{i} : goto endpoint-{name.lower()}-{i}" for i in range(len(backends)))
        lines += [
            f"add rule ip {t} {svc} numgen random mod {len(backends)} vmap {{ {choices} }}",
            f"add rule ip {t} services ip daddr {cluster_ip} tcp dport 80 goto {svc}",
        ]
        self.nft("\n".join(lines) + "\n")

    def cleanup(self) -> None:
        subprocess.run(["nft", "delete", "table", "ip", self.table], check=False,
                       capture_output=True)  # fmt: skip


@dataclass
class Remote:
    """A namespace standing in for another node, behind the veth ``uplink``."""

    netns: str
    uplink: str
    backend: str


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
    made: list[Pod] = []
    config = network.config(ipMasq=False)
    try:
        for cid in "abc":
            netns = pods.new()
            result = network.add(netns, cid, config=config)
            veth, ifindex = node_veth(result)
            made.append(Pod(cid, netns, result["ips"][0]["address"].split("/")[0], veth, ifindex))
        yield made
    finally:
        for pod in made:
            network.delete(pod.netns, pod.cid, config=config)


@pytest.fixture
def remote(pods: PodNamespaces) -> Iterator[Remote]:
    """10.250.N.7 on the far side of a veth whose node end is the uplink."""
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
        with Rtnl() as ipr:
            endpoint.attach_uplink(ipr, name, TEST_BPF_DIR)
        yield Remote(netns, name, backend)
    finally:
        with Rtnl() as ipr, contextlib.suppress(OSError):
            endpoint.detach_uplink(ipr, name, TEST_BPF_DIR)
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        try:
            yield datapath
        finally:
            datapath.set_service_ips([])


def only_b(b: Pod, *more: str) -> P.EndpointPolicy:
    peers = [P.AllowRule(peers=(P.PeerCIDR(f"{b.ip}/32"),), ports=(P.Ports("tcp", 8080),))]
    peers += [P.AllowRule(peers=(P.PeerCIDR(f"{ip}/32"),), ports=(P.Ports("tcp", 8080),))
              for ip in more]  # fmt: skip
    return P.EndpointPolicy(egress=tuple(peers))


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
    dp.set_service_ips([web, only_c, own])
    P.install(dp, a.ifindex, only_b(b))
    before = dp.counters()["egress"]["denied-policy"]
    with Server(b, tcp=(8080,)) as at_b, Server(c, tcp=(8080,)) as at_c, Server(a, tcp=(8080,)):
        outcomes = [connects(a, web) for _ in range(12)]
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
    dp.set_service_ips([svc])
    P.install(dp, a.ifindex, only_b(b))
    with Server(b, tcp=(8080,)):
        held = HeldConnection(a, Pod("svc", "", svc, "", 0), 80)
        P.install(dp, a.ifindex, P.EndpointPolicy(egress=()))
        assert held.finish() == "cut"


def test_a_remote_backend_is_judged_at_the_uplink(
    cluster: list[Pod], kube_proxy: KubeProxy | NftKubeProxy, dp: Datapath, remote: Remote
) -> None:
    a, b, _ = cluster
    svc = cluster_ip()
    kube_proxy.service("R", svc, [(remote.backend, 8080)])
    dp.set_service_ips([svc])
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
