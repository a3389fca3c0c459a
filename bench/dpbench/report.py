"""The benchmark's table and checks."""

from __future__ import annotations

import collections
import os
import statistics
from typing import Any

from dpbench.configs import CONFIGS, TARGET_RATIO, Samples


def per_round_ratio(ours: list[float], base: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, base, strict=True))


def report(bench: Any, results: dict[str, Samples], load: float, elapsed: float) -> None:
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
            "above; drop-unsupported is a frame the datapath does not judge: IPv6 from a "
            "pod, dropped in every mode, or non-IPv4 into an isolated pod)"
        )
    kernel = {c.label: results[c.label].kernel_drops for c in CONFIGS}
    print(f"check: veth and backlog drops in the kernel during the measurements: {kernel}")
    print(
        "(with no datapath or kernel drop, retransmits are spurious: veth delivery through "
        "per-CPU backlogs reorders segments now and then, with or without the programs; the "
        "receiver reports most of them as duplicates)"
    )
    print(f"run time: {elapsed:.0f} s (setup, measurements and cleanup)")
