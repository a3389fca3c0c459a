#!/usr/bin/env python3
"""The datapath's cost in two versions of sluice, measured in alternation.

``bench/datapath.py`` gives ratios against "no program" within one run; from one
run to the next they move by several points on a busy VM, more than a small
change costs. This runs that benchmark for the base commit and for the working
tree in turn (base, current, current, base, ...: each pair in alternating
order, so a slow drift hits both alike), one round each time, and compares the
per-run ratios of each configuration: their medians, and the median of the
paired differences (current - base, the runs of one pair measured minutes
apart).

The base is checked out in a temporary git worktree (the current checkout's
.venv serves both, the worktree's modules first on PYTHONPATH) and removed at
the end; so is the current version when ``--current`` names a commit (else
the working tree is measured as it is, edits included).

    .venv/bin/python bench/datapath_versions.py --base <commit> [--current <commit>] [--pairs 6]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUND = re.compile(
    r"^round \d+/\d+ (?P<label>.+?): (?P<gbits>[\d.]+) Gbit/s, RR (?P<rr>[\d.]+)/s "
    r"p50 [\d.]+ µs, CRR (?P<crr>[\d.]+)/s$"
)
BASELINE = "no program"
METRICS = ("gbits", "rr", "crr")


def one_run(tree: Path, seconds: float) -> dict[str, dict[str, float]]:
    """{configuration: {metric: ratio to "no program"}} of one round of tree's bench."""
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'bench'}"}
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / "datapath.py"), "--rounds", "1",
         "--seconds", str(seconds)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench/datapath.py in {tree} failed: {done.stderr[-2000:]}")
    found: dict[str, dict[str, float]] = {}
    for line in done.stderr.splitlines():
        match = ROUND.match(line.strip())
        if match:
            found[match["label"]] = {m: float(match[m]) for m in METRICS}
    base = found[BASELINE]
    return {
        label: {m: values[m] / base[m] for m in METRICS}
        for label, values in found.items()
        if label != BASELINE
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--current", help="the commit to measure (default: the working tree)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5, help="iperf3 run length")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: bench/datapath.py creates namespaces, veths and iptables rules")
    trees = {"base": checkout(args.base)}
    trees["current"] = checkout(args.current) if args.current else ROOT
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"base": [], "current": []}
    try:
        for pair in range(args.pairs):
            order = [("base", trees["base"]), ("current", trees["current"])]
            for name, tree in order if pair % 2 == 0 else order[::-1]:
                runs[name].append(one_run(tree, args.seconds))
                gbits = {k: round(v["gbits"], 3) for k, v in runs[name][-1].items()}
                print(f"pair {pair + 1}/{args.pairs} {name}: Gbit/s ratios {gbits}", flush=True)
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )  # fmt: skip
                shutil.rmtree(tree, ignore_errors=True)
    report(args.base, args.current or "the working tree", runs)


def checkout(commit: str) -> Path:
    """A temporary worktree of ``commit``, sharing this checkout's .venv."""
    worktree = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), commit],
        check=True, capture_output=True,
    )  # fmt: skip
    (worktree / ".venv").symlink_to(ROOT / ".venv")  # bench/dpbench runs sluicectl from there
    return worktree


def report(base: str, current: str, runs: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    labels = [label for label in runs["current"][0] if label in runs["base"][0]]
    print()
    print(
        f'ratios to "{BASELINE}", medians over {len(runs["base"])} runs of each version; '
        f"diff: median of paired differences (current - base); base {base}, current {current}"
    )
    header = f"{'configuration':<24} | {'metric':<6} | {'base':>5} | {'current':>7} | {'diff':>6}"
    print(header)
    print("-" * len(header))
    for label in labels:
        for metric in METRICS:
            old = [run[label][metric] for run in runs["base"]]
            new = [run[label][metric] for run in runs["current"]]
            diff = statistics.median(n - o for n, o in zip(new, old, strict=True))
            print(
                f"{label:<24} | {metric:<6} | {statistics.median(old):>5.3f} | "
                f"{statistics.median(new):>7.3f} | {diff:>+6.3f}"
            )


if __name__ == "__main__":
    main()
