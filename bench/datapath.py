#!/usr/bin/env python3
"""What the eBPF datapath costs pod-to-pod traffic: throughput, latency, new connections.

Two pods on this node are wired by the real plugin ("policy": "off", its own
bpfDir, subnet 10.213.0.0/24). The client pod talks to the server pod in five
configurations, interleaved within each round (the order rotates per round)
so that machine noise hits all of them alike:

    no program        the pods' node-side veths without the sluice programs
                      (their programs detached; endpoint entries kept), and
                      no after_nat on netfilter's hooks
    program, no pol.  what the plugin attaches with "policy": "off", and
                      after_nat on FORWARD and LOCAL_IN as the agent puts it
    1,000 rules       programs, and a 1,000-rule ingress policy on the server pod
    10,000 rules      programs, and a 10,000-rule ingress policy on the server pod
    iptables 1,000    no programs; the same 1,000 rules as an iptables FORWARD
                      chain every packet into the server pod traverses
    no after_nat      the programs without after_nat: against "program, no
                      policy", what after_nat alone costs

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
end, also on failure, Ctrl-C or SIGTERM. The parts live in bench/dpbench/:
topology (pods wired by the plugin through cni.spec.invoke), traffic (run in the
pods), configs (configurations and policies), iptables (the baseline
chain), report (the table).

    .venv/bin/python bench/datapath.py [--rounds 5] [--seconds 5] [--rr-seconds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from dpbench.configs import (
    CONFIGS,
    CRR_PORT,
    IPERF_PORT,
    PASS_REASONS,
    RR_PORT,
    UNLISTED_PORT,
    Config,
    Samples,
    build_policies,
)
from dpbench.iptables import Chain
from dpbench.plumbing import in_pod, on_sigterm, quietly, run
from dpbench.report import report
from dpbench.topology import Topology

from cni.datapath import after_nat
from cni.datapath import policy_install as P
from cni.datapath.events import DenyEvent, RingBuffer
from cni.datapath.maps import Datapath
from cni.policy.vocabulary import EndpointPolicy


class Bench:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        pid = os.getpid()
        self.bpf_dir = f"/sys/fs/bpf/slbench-{pid}"
        self.work = Path(tempfile.mkdtemp(prefix="sluice-bench-datapath-"))
        stack.callback(quietly, "remove the work dir", shutil.rmtree, self.work)
        self.topology = Topology(stack, str(pid), self.work, self.bpf_dir)
        self.server, self.client = self.topology.pods
        self.chain = Chain(f"SLBENCH-{pid}")
        self.policies: dict[int, EndpointPolicy] = {}
        self.sizes: dict[int, int] = {}
        self.state: tuple[bool, int | None, int | None, bool] | None = None
        self.checks: list[str] = []

    @property
    def chain_counts(self) -> list[int]:
        return self.chain.counts

    def setup(self) -> None:
        self.topology.setup()
        self.dp = Datapath(self.bpf_dir)
        self.stack.callback(self.dp.close)
        self.ring = RingBuffer(self.dp.path("events"))
        self.stack.callback(self.ring.close)
        self.policies, self.sizes = build_policies(self.client.ip)
        after_nat.attach(self.dp)  # as the agent puts it; off with the programs
        self.stack.callback(quietly, "detach after_nat", after_nat.detach, self.dp)

    def enter(self, config: Config) -> None:
        """Make the node look like ``config``, changing only what differs."""
        judged_after_nat = config.programs and config.after_nat
        want = (config.programs, config.rules, config.iptables, judged_after_nat)
        have = self.state or (True, None, None, True)  # as the plugin and setup() left it
        if self.state is None or have[2] != want[2]:
            self.chain.remove()
        if self.state is None or have[1] != want[1]:
            policy = self.policies[want[1]] if want[1] else EndpointPolicy()
            P.install(self.dp, self.server.ifindex, policy)
        if have[0] != want[0]:
            self.topology.set_programs(want[0])
        if have[3] != want[3]:
            if want[3]:
                after_nat.attach(self.dp)
            else:
                after_nat.detach(self.dp)
        self.topology.check_hooks(want[0])
        if want[2] and have[2] != want[2]:
            self.chain.add(want[2], self.server.veth, self.client.ip)
        self.state = want

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
            self.dp.conntrack.sweep({self.server.ifindex, self.client.ifindex})
        for _ in self.ring.drain():
            pass  # events from before (the policy check's probe)
        before = self.drop_counters()
        chain_before = self.chain.counters() if config.iptables else (0, 0)
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
            accept, drop = self.chain.counters()
            self.chain.counts[0] += accept - chain_before[0]
            self.chain.counts[1] += drop - chain_before[1]


def main() -> None:
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
        stack.callback(quietly, "remove the iptables chain", bench.chain.remove)
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
