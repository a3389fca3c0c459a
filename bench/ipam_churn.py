#!/usr/bin/env python3
"""Random pod churn against sluice-ipam in prefix mode: packing and latency.

Pods come and go at random (the population wanders between --low and
--high) on simulated time, so that cooldowns pass as they would on a busy
node without the benchmark waiting for them. After every step it records

    packing = prefixes held / ceil(allocated / block size)

(1.0 is perfect; every extra block held is address space other nodes cannot
use) and it times each allocation on the real store (SQLite, fsync included).

    .venv/bin/python bench/ipam_churn.py [--steps 4000] [--warm 1] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # the tests' clock

from ipam import config as ipam_config  # noqa: E402
from ipam.modes import open_allocator  # noqa: E402
from ipam.prefix import PrefixAllocator  # noqa: E402
from tests.harness.clock import SimulatedClock  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--low", type=int, default=60, help="fewest pods on the node")
    parser.add_argument("--high", type=int, default=110, help="most pods on the node")
    parser.add_argument("--warm", type=int, default=1, help="warmPrefixes")
    parser.add_argument("--cooldown", type=float, default=120.0, help="cooldownSeconds")
    parser.add_argument(
        "--interval", type=float, default=10.0, help="mean simulated seconds between pod events"
    )
    parser.add_argument("--prefix-length", type=int, default=28)
    parser.add_argument("--seeds", type=int, default=3, help="independent runs")
    args = parser.parse_args()
    packings, latencies, most_held = [], [], 0
    for seed in range(1, args.seeds + 1):
        run_packing, run_latencies, run_held = churn(args, seed)
        packings.append(run_packing)
        latencies += run_latencies
        most_held = max(most_held, run_held)
        print(f"seed {seed}: mean packing {run_packing:.3f}", file=sys.stderr)

    print(
        f"prefix mode, pool 10.128.0.0/16 in /{args.prefix_length} blocks, "
        f"warmPrefixes {args.warm}, cooldown {args.cooldown:.0f} s, {args.seeds} runs of "
        f"{args.steps} steps, {args.low}-{args.high} pods, one event per "
        f"{args.interval:.0f} s on average (simulated)"
    )
    print(
        f"mean packing         {statistics.fmean(packings):.3f}  "
        f"(runs {', '.join(f'{p:.3f}' for p in packings)}; most blocks held {most_held})"
    )
    print(
        f"allocation latency   median {statistics.median(latencies) * 1000:.2f} ms, "
        f"p95 {sorted(latencies)[int(len(latencies) * 0.95)] * 1000:.2f} ms "
        f"({len(latencies)} allocations)"
    )


def churn(args: argparse.Namespace, seed: int) -> tuple[float, list[float], int]:
    """One run: mean packing, allocation latencies, most blocks held."""

    rng = random.Random(seed)
    clock = SimulatedClock()
    work = tempfile.mkdtemp(prefix="sluice-churn-")
    config = ipam_config.from_plugin(
        "churn",
        {
            "stateDir": work,
            "ipam": {
                "type": "sluice-ipam",
                "mode": "prefix",
                "pool": "10.128.0.0/16",
                "prefixLength": args.prefix_length,
                "warmPrefixes": args.warm,
                "cooldownSeconds": args.cooldown,
                "nodeName": "bench",
            },
        },
    )
    allocator = open_allocator(config, clock)
    assert isinstance(allocator, PrefixAllocator)
    block = 2 ** (32 - args.prefix_length)

    pods: list[str] = []
    latencies: list[float] = []
    packings: list[float] = []
    most_held = 0
    for step in range(args.steps):
        clock.advance(rng.expovariate(1 / args.interval))
        grow = len(pods) < args.low or (len(pods) < args.high and rng.random() < 0.5)
        if grow:
            pod = f"pod-{step}"
            start = time.perf_counter()
            allocator.allocate(pod, "eth0")
            latencies.append(time.perf_counter() - start)
            pods.append(pod)
        else:
            allocator.release(pods.pop(rng.randrange(len(pods))), "eth0")
        held = len(allocator.store.prefixes())
        most_held = max(most_held, held)
        packings.append(held / math.ceil(len(pods) / block))
    allocator.close()
    shutil.rmtree(work, ignore_errors=True)
    return statistics.fmean(packings), latencies, most_held


if __name__ == "__main__":
    main()
