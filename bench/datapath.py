#!/usr/bin/env python3
"""What the eBPF datapath costs pod-to-pod traffic: throughput, latency, new connections.

Two pods on this node are wired by the real plugin ("policy": "off", its own
bpfDir, subnet 10.213.0.0/24). The client pod talks to the server pod in five
configurations, interleaved within each round (the order rotates per round)
so that machine noise hits all of them alike:

    no program        the pods' node-side veths without the sluice programs
                      (their programs detached; endpoint entries kept)
    program, no pol.  what the plugin attaches with "policy": "off"
    1,000 rules       programs, and a 1,000-rule ingress policy on the server pod
    10,000 rules      programs, and a 10,000-rule ingress policy on the server pod
    iptables 1,000    no programs; the same 1,000 rules as an iptables FORWARD
                      chain every packet into the server pod traverses

A "rule" is one allowed (peer /32, tcp, port) combination. All of them but
one name other peers (172.16.0.0/16, one distinct address per rule) and
ports (10000-59999); the last one allows the client on the benchmark ports,
so the benchmark traffic is judged by the whole policy.

Per configuration and round it measures:

    Gbit/s     iperf3, one TCP stream, --seconds long (end.sum_received)
    RR         1-byte ping-pong on one TCP connection (TCP_NODELAY) for
               --rr-seconds: transactions/s and the latency of one round trip
               (mean, p50, p99 in microseconds; Python client and server, so
               the absolute numbers include interpreter time)
    CRR        connect, 1-byte request, 1-byte response, close (RST) in a
               loop for --rr-seconds: connections/s

The table shows the median over rounds of every number; a ratio is the median
over rounds of (configuration / "no program") measured in the same round, so
1.00 is "as fast as without the datapath" (for latency, lower is better).

How to read it: the datapath keeps its own conntrack, so a policy is looked up
once per new flow; every later packet of an established flow is a conntrack
hit, whatever the size of the policy. Throughput and RR therefore mostly show
the fixed per-packet cost of the programs; CRR opens a new flow per
transaction and shows the per-flow policy lookup. The iptables chain has no
ESTABLISHED shortcut: every packet walks the rules, as written.

The datapath's conntrack entries of both pods are swept before every
measurement, so CRR's connections are all new flows. The iptables chain ends
in a DROP (the pod is isolated: what no rule allows is dropped).

Checks printed under the table: a connection to a port no rule allows must
time out (dropped) with a policy and be refused without one; the datapath's
drop counters and deny events around every measurement (a drop of benchmark
traffic would be a datapath bug and is flagged as PROBLEM); veth and backlog
drops in the kernel; the iperf3 client's retransmitted segments and how many
of them the receiver reported as duplicates (DSACK), i.e. were not lost.
Everything the run creates (pods, bpfDir, iptables chain) is removed at the
end, also on failure, Ctrl-C or SIGTERM.

    .venv/bin/python bench/datapath.py [--rounds 5] [--seconds 5] [--rr-seconds 3]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cni.datapath import endpoint
from cni.datapath import policy as P
from cni.datapath.events import DenyEvent, RingBuffer
from cni.datapath.maps import Datapath
from cni.net.netlink import Rtnl

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
REFERENCE = Path("/usr/lib/cni")
SUBNET = "10.213.0.0/24"
IPERF_PORT, RR_PORT, CRR_PORT = 5201, 5202, 5203
BENCH_PORTS = (IPERF_PORT, RR_PORT, CRR_PORT)
UNLISTED_PORT = 5299  # no rule allows it: the policy check expects a drop
MAX_PEERS = 65536  # one distinct peer per rule up to a /16
PASS_REASONS = ("allowed", "allowed-reply")
TARGET_RATIO = 0.95


# -- helpers run inside the pods (this file again, through ip netns exec) ------------------


def serve(rr_port: int, crr_port: int) -> None:
    """The RR and CRR servers: one thread each, until killed."""

    def listener(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(512)
        return sock

    def rr(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                recv, send = conn.recv, conn.send
                while data := recv(1):
                    send(data)

    def crr(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            with conn, contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if data := conn.recv(1):
                    conn.send(data)

    rr_sock, crr_sock = listener(rr_port), listener(crr_port)
    threading.Thread(target=crr, args=(crr_sock,), daemon=True).start()
    rr(rr_sock)


def rr_client(host: str, port: int, seconds: float) -> dict:
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send, recv, clock = sock.send, sock.recv, time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    start = now = clock()
    deadline = start + int(seconds * 1e9)
    while now < deadline:
        send(b"x")
        if not recv(1):
            raise ConnectionError("the RR server closed the connection")
        later = clock()
        append(later - now)
        now = later
    sock.close()
    samples.sort()
    n = len(samples)
    return {
        "transactions_per_s": n / ((now - start) / 1e9),
        "mean_us": sum(samples) / n / 1e3,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[min(n - 1, n * 99 // 100)] / 1e3,
        "max_us": samples[-1] / 1e3,
    }


def crr_client(host: str, port: int, seconds: float) -> dict:
    linger = struct.pack("ii", 1, 0)  # close with RST: no TIME_WAIT, no port exhaustion
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect((host, port))
        sock.send(b"x")
        if not sock.recv(1):
            raise ConnectionError("the CRR server closed the connection early")
        sock.close()
        count += 1
    return {"connections_per_s": count / (time.perf_counter() - start)}


def probe(host: str, port: int) -> dict:
    """How a connection attempt ends: connected, refused (RST) or timeout (dropped)."""
    try:
        socket.create_connection((host, port), timeout=1.5).close()
        return {"outcome": "connected"}
    except ConnectionRefusedError:
        return {"outcome": "refused"}
    except TimeoutError:
        return {"outcome": "timeout"}


HELPERS: dict[str, Callable[..., dict | None]] = {
    "_serve": lambda rr, crr: serve(int(rr), int(crr)),
    "_rr": lambda host, port, s: rr_client(host, int(port), float(s)),
    "_crr": lambda host, port, s: crr_client(host, int(port), float(s)),
    "_probe": lambda host, port: probe(host, int(port)),
}


# -- the node side --------------------------------------------------------------------


def run(cmd: list, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr}")
    return proc


def in_pod(netns: str, *args: object, timeout: float = 60) -> dict:
    """Run one of this file's helpers in a pod; its JSON answer."""
    proc = run(["ip", "netns", "exec", netns, sys.executable, __file__, *args], timeout=timeout)
    return json.loads(proc.stdout)


@dataclass
class Pod:
    name: str  # netns and container id suffix
    ip: str = ""
    veth: str = ""
    ifindex: int = 0


@dataclass(frozen=True)
class Config:
    label: str
    programs: bool  # the sluice programs attached to both veths
    rules: int | None = None  # an ingress policy of this many rules on the server
    iptables: int | None = None  # an iptables chain of this many rules


CONFIGS = (
    Config("no program", programs=False),
    Config("program, no policy", programs=True),
    Config("program, 1,000 rules", programs=True, rules=1000),
    Config("program, 10,000 rules", programs=True, rules=10000),
    Config("iptables, 1,000 rules", programs=False, iptables=1000),
)


@dataclass
class Samples:
    gbits: list[float] = field(default_factory=list)
    retransmits: list[int] = field(default_factory=list)
    dsacked: list[int] = field(default_factory=list)  # retransmits the receiver already had
    rr: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    crr: list[float] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    kernel_drops: int = 0  # veth and backlog drops outside the datapath
    events: list[DenyEvent] = field(default_factory=list)  # the datapath's deny events


def other_peers(n: int) -> list[tuple[str, int]]:
    """n distinct (peer address, tcp port) pairs that the benchmark traffic never matches."""
    peers = min(n, MAX_PEERS)
    base = int(ipaddress.IPv4Address("172.16.0.1"))
    pairs = []
    for k in range(peers):
        count = n // peers + (k < n % peers)
        address = str(ipaddress.IPv4Address(base + k))
        pairs.extend((address, 10000 + (k * 131 + j * 1009) % 50000) for j in range(count))
    assert len(set(pairs)) == n
    return pairs


class Bench:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.pid = os.getpid()
        self.net = f"slbench{self.pid}"
        self.bpf_dir = f"/sys/fs/bpf/slbench-{self.pid}"
        self.chain = f"SLBENCH-{self.pid}"
        self.work = Path(tempfile.mkdtemp(prefix="sluice-bench-datapath-"))
        stack.callback(quietly, "remove the work dir", shutil.rmtree, self.work)
        self.bin = self.work / "bin"
        self.server = Pod(f"slbench-{self.pid}-srv")
        self.client = Pod(f"slbench-{self.pid}-cli")
        self.config = {
            "cniVersion": "1.1.0",
            "name": self.net,
            "type": "sluice",
            "policy": "off",
            "ipMasq": False,
            "stateDir": str(self.work / "state"),
            "bpfDir": self.bpf_dir,
            "ipam": {"type": "sluice-ipam", "subnet": SUBNET},
        }
        self.dp = None
        self.policies: dict[int, object] = {}
        self.sizes: dict[int, int] = {}
        self.state: tuple[bool, int | None, int | None] | None = None
        self.filter_table_existed = True
        self.chain_counts = [0, 0]  # packets of the matching ACCEPT and the final DROP
        self.checks: list[str] = []

    # -- setup ------------------------------------------------------------------------

    def setup(self) -> None:
        run(
            [
                VENV_BIN / "sluicectl",
                "install",
                "--bin-dir",
                self.bin,
                "--conf-dir",
                self.work / "net.d",
            ]
        )
        for plugin in ("host-local", "loopback"):
            (self.bin / plugin).symlink_to(REFERENCE / plugin)
        # The datapath's pins and the (unused with ipMasq off) nftables table go last.
        self.stack.callback(quietly, "remove the bpfDir", shutil.rmtree, self.bpf_dir)
        self.stack.callback(
            quietly,
            "delete the nftables table",
            run,
            ["nft", "delete", "table", "ip", f"sluice_{self.net}"],
            check=False,
        )
        started = time.monotonic()
        for pod in (self.server, self.client):
            self.add_pod(pod)
        print(
            f"pods wired in {time.monotonic() - started:.1f} s (includes the bcc compile): "
            f"server {self.server.ip} on {self.server.veth}, "
            f"client {self.client.ip} on {self.client.veth}",
            file=sys.stderr,
        )
        # A wide port range: CRR opens thousands of connections per measurement.
        run(
            [
                "ip",
                "netns",
                "exec",
                self.client.name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_local_port_range=1024 65535",
            ]
        )

        self.dp = Datapath(self.bpf_dir)
        self.stack.callback(self.dp.close)
        self.ring = RingBuffer(self.dp.path("events"))
        self.stack.callback(self.ring.close)
        self.build_policies()
        self.start_servers()

    def add_pod(self, pod: Pod) -> None:
        run(["ip", "netns", "add", pod.name])
        self.stack.callback(
            quietly, f"delete netns {pod.name}", run, ["ip", "netns", "del", pod.name]
        )
        run(["ip", "-n", pod.name, "link", "set", "lo", "up"])
        self.stack.callback(quietly, f"DEL {pod.name}", self.plugin, "DEL", pod)
        result = json.loads(self.plugin("ADD", pod))
        pod.ip = str(ipaddress.ip_interface(result["ips"][0]["address"]).ip)
        pod.veth = result["interfaces"][0]["name"]
        pod.ifindex = int(Path(f"/sys/class/net/{pod.veth}/ifindex").read_text())

    def plugin(self, command: str, pod: Pod) -> str:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"bench-{pod.name}",
            "CNI_NETNS": f"/run/netns/{pod.name}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(self.bin),
        }
        proc = subprocess.run(
            [self.bin / "sluice"],
            input=json.dumps(self.config),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"sluice {command} {pod.name} failed: {proc.stdout} {proc.stderr}")
        return proc.stdout

    def build_policies(self) -> None:
        allow_client = P.AllowRule(
            peers=(P.PeerCIDR(f"{self.client.ip}/32"),),
            ports=tuple(P.Ports("tcp", port) for port in BENCH_PORTS),
        )
        for config in CONFIGS:
            if config.rules is None or config.rules in self.policies:
                continue
            by_peer: dict[str, list[int]] = {}
            for address, port in other_peers(config.rules - 1):
                by_peer.setdefault(address, []).append(port)
            rules = tuple(
                P.AllowRule(
                    peers=(P.PeerCIDR(f"{address}/32"),),
                    ports=tuple(P.Ports("tcp", port) for port in ports),
                )
                for address, ports in by_peer.items()
            )
            policy = P.EndpointPolicy(ingress=(allow_client, *rules))
            started = time.monotonic()
            self.sizes[config.rules] = P.size(policy)
            print(
                f"{config.rules} rules ({len(by_peer)} other peers): "
                f"{self.sizes[config.rules]} map entries, "
                f"compiled in {time.monotonic() - started:.1f} s",
                file=sys.stderr,
            )
            self.policies[config.rules] = policy

    def start_servers(self) -> None:
        for cmd in (
            ["iperf3", "-s", "-p", IPERF_PORT],
            [sys.executable, __file__, "_serve", RR_PORT, CRR_PORT],
        ):
            server = subprocess.Popen(
                ["ip", "netns", "exec", self.server.name, *map(str, cmd)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.stack.callback(quietly, f"stop {cmd[0]}", stop, server)
        deadline = time.monotonic() + 10
        while True:
            listing = run(["ip", "netns", "exec", self.server.name, "ss", "-Htln"]).stdout
            if all(f":{port} " in listing for port in BENCH_PORTS):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the servers do not listen on {BENCH_PORTS}: {listing}")
            time.sleep(0.1)

    # -- switching configurations ---------------------------------------------------------

    def enter(self, config: Config) -> None:
        """Make the node look like ``config``, changing only what differs."""
        want = (config.programs, config.rules, config.iptables)
        have = self.state or (True, None, None)  # as the plugin left it
        if self.state is None or have[2] != want[2]:
            self.remove_chain()
        if self.state is None or have[1] != want[1]:
            policy = self.policies[want[1]] if want[1] else P.EndpointPolicy()
            P.install(self.dp, self.server.ifindex, policy)
        if have[0] != want[0]:
            with Rtnl() as ipr:
                for pod in (self.server, self.client):
                    if want[0]:
                        endpoint.attach_programs(ipr, pod.ifindex, pod.veth, self.bpf_dir)
                    else:
                        endpoint.detach_programs(ipr, pod.ifindex, self.bpf_dir)
        self.check_hooks(want[0])
        if want[2] and have[2] != want[2]:
            self.add_chain(want[2])
        self.state = want

    def check_hooks(self, attached: bool) -> None:
        with Rtnl() as ipr:
            for pod in (self.server, self.client):
                hooks = set(endpoint.attached_programs(ipr, pod.ifindex, self.bpf_dir))
                if hooks != (set(endpoint.HOOKS) if attached else set()):
                    raise RuntimeError(f"{pod.veth} runs {sorted(hooks)}, attached={attached}")

    def add_chain(self, n: int) -> None:
        self.filter_table_existed = self.nft_has_filter_table()
        lines = ["*filter", f":{self.chain} - [0:0]"]
        lines += [
            f"-A {self.chain} -s {address}/32 -p tcp -m tcp --dport {port} -j ACCEPT"
            for address, port in other_peers(n - 1)
        ]
        lines += [
            f"-A {self.chain} -s {self.client.ip}/32 -p tcp -m tcp "
            f"--dport {min(BENCH_PORTS)}:{max(BENCH_PORTS)} -j ACCEPT",
            f"-A {self.chain} -j DROP",  # an isolated pod: what no rule allows drops
            f"-I FORWARD 1 -o {self.server.veth} -j {self.chain}",
            "COMMIT",
            "",
        ]
        proc = subprocess.run(
            ["iptables-restore", "--noflush"],
            input="\n".join(lines),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            self.remove_chain()
            raise RuntimeError(f"iptables-restore failed: {proc.stderr}")
        listed = run(["iptables", "-S", self.chain]).stdout.count(f"-A {self.chain} ")
        if listed != n + 1:
            raise RuntimeError(f"{self.chain} holds {listed} rules, expected {n + 1}")

    def remove_chain(self) -> None:
        """The jump, the chain, and the filter table if this benchmark brought it."""
        while (
            run(
                ["iptables", "-D", "FORWARD", "-o", self.server.veth, "-j", self.chain], check=False
            ).returncode
            == 0
        ):
            pass
        if run(["iptables", "-S", self.chain], check=False).returncode == 0:
            run(["iptables", "-F", self.chain])
            run(["iptables", "-X", self.chain])
        if not self.filter_table_existed and self.nft_has_filter_table():
            rules = run(["iptables", "-S"]).stdout.splitlines()
            if all(line.startswith("-P ") for line in rules):
                run(["nft", "delete", "table", "ip", "filter"], check=False)
        self.filter_table_existed = True

    @staticmethod
    def nft_has_filter_table() -> bool:
        return run(["nft", "list", "table", "ip", "filter"], check=False).returncode == 0

    def chain_counters(self) -> tuple[int, int]:
        """Packets of the matching ACCEPT rule and of the final DROP."""
        rows = run(["iptables", "-L", self.chain, "-v", "-x", "-n"]).stdout.splitlines()[2:]
        accept, drop = rows[-2].split(), rows[-1].split()
        if accept[2] != "ACCEPT" or drop[2] != "DROP":
            raise RuntimeError(f"unexpected tail of {self.chain}: {rows[-2:]}")
        return int(accept[0]), int(drop[0])

    # -- measuring ----------------------------------------------------------------------------

    def drop_counters(self) -> dict[str, int]:
        totals = self.dp.counters()
        return {
            f"{direction}/{reason}": value
            for direction, reasons in totals.items()
            for reason, value in reasons.items()
            if reason not in PASS_REASONS
        }

    def tcp_counters(self) -> tuple[int, int]:
        """The client pod's retransmitted segments, and those its peer reported as duplicates."""
        proc = run(["ip", "netns", "exec", self.client.name, "nstat", "-asz", "-j"])
        counters = json.loads(proc.stdout)
        counters = counters.get("kernel", counters)
        return counters["TcpRetransSegs"], counters["TcpExtTCPDSACKRecvSegs"]

    def kernel_drops(self) -> int:
        """Drops of the pods' veths (both ends) and of the CPUs' backlog queues (all of them)."""
        with open("/proc/net/softnet_stat") as stat:
            total = sum(int(line.split()[1], 16) for line in stat)
        for pod in (self.server, self.client):
            for counter in ("rx_dropped", "tx_dropped"):
                total += int(Path(f"/sys/class/net/{pod.veth}/statistics/{counter}").read_text())
            proc = run(["ip", "-n", pod.name, "-s", "-j", "link", "show", "eth0"])
            stats = json.loads(proc.stdout)[0]["stats64"]
            total += stats["rx"]["dropped"] + stats["tx"]["dropped"]
        return total

    def check_policy(self, config: Config) -> None:
        """Once per configuration: an unlisted port must be dropped (isolated) or refused."""
        outcome = in_pod(self.client.name, "_probe", self.server.ip, UNLISTED_PORT)["outcome"]
        expected = "timeout" if config.rules or config.iptables else "refused"
        self.checks.append(
            f"{config.label}: a connection to unlisted port {UNLISTED_PORT} was {outcome}"
            + ("" if outcome == expected else f" -- EXPECTED {expected}")
        )

    def measure(self, config: Config, samples: Samples) -> None:
        if config.programs:
            # Every measurement starts with no flow known: CRR's connections are all new.
            self.dp.sweep_flows({self.server.ifindex, self.client.ifindex})
        for _ in self.ring.drain():
            pass  # events from before (the policy check's probe)
        before = self.drop_counters()
        chain_before = self.chain_counters() if config.iptables else (0, 0)
        seconds = self.args.seconds
        tcp_before = self.tcp_counters()
        kernel_before = self.kernel_drops()
        proc = run(
            [
                "ip",
                "netns",
                "exec",
                self.client.name,
                "iperf3",
                "-c",
                self.server.ip,
                "-p",
                IPERF_PORT,
                "-t",
                seconds,
                "-J",
                "--connect-timeout",
                "5000",
            ],
            timeout=seconds + 30,
            check=False,
        )
        report = json.loads(proc.stdout) if proc.stdout.strip() else {}
        if proc.returncode != 0 or "error" in report:
            raise RuntimeError(f"iperf3 failed ({config.label}): {report.get('error', proc)}")
        samples.gbits.append(report["end"]["sum_received"]["bits_per_second"] / 1e9)
        tcp_after = self.tcp_counters()
        samples.retransmits.append(tcp_after[0] - tcp_before[0])
        samples.dsacked.append(tcp_after[1] - tcp_before[1])
        rr_seconds = self.args.rr_seconds
        rr = in_pod(self.client.name, "_rr", self.server.ip, RR_PORT, rr_seconds)
        samples.rr.append(rr["transactions_per_s"])
        samples.mean.append(rr["mean_us"])
        samples.p50.append(rr["p50_us"])
        samples.p99.append(rr["p99_us"])
        crr = in_pod(self.client.name, "_crr", self.server.ip, CRR_PORT, rr_seconds)
        samples.crr.append(crr["connections_per_s"])
        after = self.drop_counters()
        samples.events += [DenyEvent.decode(record) for record in self.ring.drain()]
        samples.kernel_drops += self.kernel_drops() - kernel_before
        for key, value in after.items():
            if value > before[key]:
                samples.drops[key] = samples.drops.get(key, 0) + value - before[key]
        if config.iptables:
            accept, drop = self.chain_counters()
            self.chain_counts[0] += accept - chain_before[0]
            self.chain_counts[1] += drop - chain_before[1]


# -- reporting -------------------------------------------------------------------------------


def per_round_ratio(ours: list[float], base: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, base, strict=True))


def report(bench: Bench, results: dict[str, Samples], load: float, elapsed: float) -> None:
    args = bench.args
    base = results[CONFIGS[0].label]
    print()
    print(
        f"pod-to-pod on one node, {args.rounds} rounds, iperf3 {args.seconds:g} s, "
        f"RR and CRR {args.rr_seconds:g} s each; medians over rounds, ratios vs "
        f'"{CONFIGS[0].label}" (median of per-round ratios); {os.cpu_count()} CPUs, '
        f"load average {load:.2f} at the start"
    )
    header = (
        f"{'configuration':<22} | {'entries':>7} | {'Gbit/s':>6} | {'ratio':>5} | "
        f"{'RR tr/s':>7} | {'ratio':>5} | {'mean µs':>7} | {'p50 µs':>6} | {'p99 µs':>6} | "
        f"{'ratio':>5} | {'CRR c/s':>7} | {'ratio':>5}"
    )
    print(header)
    print("-" * len(header))
    med = statistics.median
    for config in CONFIGS:
        s = results[config.label]
        entries = "-"
        if config.rules:
            entries = str(bench.sizes[config.rules])
        elif config.iptables:
            entries = f"{config.iptables + 1}r"
        print(
            f"{config.label:<22} | {entries:>7} | {med(s.gbits):>6.2f} | "
            f"{per_round_ratio(s.gbits, base.gbits):>5.2f} | {med(s.rr):>7.0f} | "
            f"{per_round_ratio(s.rr, base.rr):>5.2f} | {med(s.mean):>7.1f} | "
            f"{med(s.p50):>6.1f} | {med(s.p99):>6.1f} | "
            f"{per_round_ratio(s.p50, base.p50):>5.2f} | {med(s.crr):>7.0f} | "
            f"{per_round_ratio(s.crr, base.crr):>5.2f}"
        )
    print()
    print(
        "columns: entries = map entries the policy compiles to (P.size: LPM peers + rule hash "
        "entries; iptables: rules in the chain, the final DROP included); ratio after Gbit/s, "
        "RR tr/s and CRR c/s: higher is better; ratio after p50: lower is better"
    )
    print(
        "note: the datapath keeps conntrack, so a policy is evaluated once per new flow "
        "(iperf3, RR: one or two flows per run; CRR: every connection); packets of "
        "established flows are conntrack hits. The iptables chain is walked by every packet "
        "into the server pod (no ESTABLISHED shortcut)."
    )
    big, no_policy = results[CONFIGS[3].label], results[CONFIGS[1].label]
    gbits = per_round_ratio(big.gbits, base.gbits)
    verdict = "met" if gbits >= TARGET_RATIO else "NOT met"
    rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(big.gbits, base.gbits, strict=True))
    print(
        f"target: throughput at 10,000 rules vs no program = {gbits:.3f} "
        f"(target >= {TARGET_RATIO}): {verdict}; per round: {rounds}"
    )
    print(
        "  the same against the programs without a policy (the cost of the policy alone): "
        f"{per_round_ratio(big.gbits, no_policy.gbits):.3f}; the no-program runs alone "
        f"spread over {min(base.gbits):.1f}-{max(base.gbits):.1f} Gbit/s"
    )
    for check in bench.checks:
        print(f"check: {check}")
    print(
        f"check: iptables chain: {bench.chain_counts[0]} packets hit the matching ACCEPT, "
        f"{bench.chain_counts[1]} the final DROP"
    )
    benchmark = {bench.client.ip, bench.server.ip}
    veths = {pod.ifindex: pod.veth for pod in (bench.server, bench.client)}
    for config in CONFIGS:
        s = results[config.label]
        if s.drops:
            print(f"datapath drops in {config.label!r} (counters): {s.drops}")
        events = collections.Counter(
            (
                "BENCHMARK TRAFFIC"
                if {e.source, e.destination} == benchmark
                else "not benchmark traffic",
                f"{e.direction} {e.reason} on {veths.get(e.ifindex, e.ifindex)}: {e.protocol} "
                f"{e.source}:{e.sport} -> {e.destination}:{e.dport}",
            )
            for e in s.events
        )
        for (kind, event), count in sorted(events.items()):
            print(f"  {kind}: {count} x {event}")
        print(
            f"iperf3 retransmitted segments per round, {config.label}: {s.retransmits} "
            f"(reported duplicate by the receiver, DSACK: {s.dsacked})"
        )
    dropped = sum(
        {e.source, e.destination} == benchmark for c in CONFIGS for e in results[c.label].events
    )
    others = sum(sum(results[c.label].drops.values()) for c in CONFIGS) - dropped
    if dropped:
        print(f"PROBLEM: the datapath dropped {dropped} packets of benchmark traffic (see above)")
    else:
        print(
            f"check: the datapath dropped no benchmark packet ({others} other drops, listed "
            "above; drop-unsupported is a non-IPv4 frame, e.g. IPv6 from the node, into an "
            "isolated pod)"
        )
    kernel = {c.label: results[c.label].kernel_drops for c in CONFIGS}
    print(f"check: veth and backlog drops in the kernel during the measurements: {kernel}")
    print(
        "(with no datapath or kernel drop, retransmits are spurious: veth delivery through "
        "per-CPU backlogs reorders segments now and then, with or without the programs; the "
        "receiver reports most of them as duplicates)"
    )
    print(f"run time: {elapsed:.0f} s (setup, measurements and cleanup)")


# -- plumbing ---------------------------------------------------------------------------------


def quietly(what: str, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
    """A cleanup step: failures are reported, never stop the other steps."""
    try:
        fn(*args, **kwargs)
    except FileNotFoundError:
        pass
    except Exception as err:
        print(f"cleanup: failed to {what}: {err}", file=sys.stderr)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in HELPERS:
        answer = HELPERS[sys.argv[1]](*sys.argv[2:])
        print(json.dumps(answer))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5, help="iperf3 run length")
    parser.add_argument("--rr-seconds", type=float, default=3, help="RR and CRR run length")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates namespaces, veths and iptables rules")

    started = time.monotonic()
    load = os.getloadavg()[0]
    results = {config.label: Samples() for config in CONFIGS}
    signal.signal(signal.SIGTERM, on_sigterm)  # like Ctrl-C: clean up, then exit
    stack = contextlib.ExitStack()
    interrupted = False
    try:
        bench = Bench(args, stack)
        bench.setup()
        # Undone before the pods go: the chain's jump names the server's veth.
        stack.callback(quietly, "remove the iptables chain", bench.remove_chain)
        checked: set[str] = set()
        for r in range(args.rounds):
            shift = r % len(CONFIGS)
            for config in CONFIGS[shift:] + CONFIGS[:shift]:
                bench.enter(config)
                if config.label not in checked:
                    bench.check_policy(config)
                    checked.add(config.label)
                bench.measure(config, results[config.label])
                s = results[config.label]
                print(
                    f"round {r + 1}/{args.rounds} {config.label}: {s.gbits[-1]:.2f} Gbit/s, "
                    f"RR {s.rr[-1]:.0f}/s p50 {s.p50[-1]:.1f} µs, CRR {s.crr[-1]:.0f}/s",
                    file=sys.stderr,
                )
        bench.enter(CONFIGS[1])  # as the plugin left it
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # Neither a second Ctrl-C nor SIGTERM may cut the cleanup short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.close()
    if interrupted:
        sys.exit("interrupted; everything the benchmark created is removed")
    report(bench, results, load, time.monotonic() - started)


if __name__ == "__main__":
    main()
