#!/usr/bin/env python3
"""ADD and DEL latency of sluice next to the reference plugins (ptp + host-local).

Each plugin is exec'd exactly as a runtime does it, one pod at a time, each
pod in its own network namespace. Rounds interleave the plugins (their order
alternates) so that machine noise hits all of them alike; the ratios are
computed per round and their median is reported.

    .venv/bin/python bench/add_del.py [--rounds 5] [--pods 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from cni.datapath import loader
from cni.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path("/usr/lib/cni")


def exec_plugin(
    binary: Path, command: str, config: dict, container_id: str, netns: str, bin_dir: Path
) -> float:
    """Seconds one call took, run as a runtime runs it; exit on failure."""
    env = cni_env(
        command, container_id=container_id, netns=netns, ifname="eth0", cni_path=str(bin_dir)
    )
    run = invoke(str(binary), env, config)
    if run.rc != 0:
        sys.exit(f"{binary.name} {command} failed: {run.stdout} {run.stderr}")
    return run.seconds


class Contender:
    def __init__(self, label: str, binary: Path, config: dict) -> None:
        self.label = label
        self.binary = binary
        self.config = config
        self.add: list[list[float]] = []  # per round
        self.delete: list[list[float]] = []

    def round(self, pods: int, bin_dir: Path) -> None:
        adds, dels = [], []
        for i in range(pods):
            name = f"slb-{uuid.uuid4().hex[:8]}"
            subprocess.run(["ip", "netns", "add", name], check=True)
            netns = f"/run/netns/{name}"
            cid = f"bench-{self.label}-{i}-{name}"
            try:
                adds.append(exec_plugin(self.binary, "ADD", self.config, cid, netns, bin_dir))
                dels.append(exec_plugin(self.binary, "DEL", self.config, cid, netns, bin_dir))
            finally:
                subprocess.run(["ip", "netns", "del", name], check=False)
        self.add.append(adds)
        self.delete.append(dels)


def nft_table_exists(family: str, name: str) -> bool:
    proc = subprocess.run(["nft", "list", "table", family, name], capture_output=True, check=False)
    return proc.returncode == 0


def median_ms(samples: list[list[float]]) -> float:
    return statistics.median(x for round_ in samples for x in round_) * 1000


def ratio(ours: list[list[float]], theirs: list[list[float]]) -> float:
    return statistics.median(
        statistics.median(a) / statistics.median(b) for a, b in zip(ours, theirs, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pods", type=int, default=20, help="pods per plugin and round")
    parser.add_argument(
        "--no-ip-masq", action="store_true", help="run both without masquerading (ptp's default)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates namespaces and veths")

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    bin_dir = work / "bin"
    subprocess.run(
        [
            ROOT / ".venv" / "bin" / "sluicectl",
            "install",
            "--bin-dir",
            bin_dir,
            "--conf-dir",
            work / "net.d",
        ],
        check=True,
        capture_output=True,
    )
    for plugin in ("ptp", "bridge", "host-local"):
        (bin_dir / plugin).symlink_to(REFERENCE / plugin)
    # ptp's ipMasq creates iptables' nat table and leaves it behind: remove it after.
    nat_existed = nft_table_exists("ip", "nat")
    # The datapath is compiled once per node, before any pod: not part of an ADD.
    bpf_dir = f"/sys/fs/bpf/slbench-{os.getpid()}"
    loader.load(bpf_dir)
    masq = not args.no_ip_masq
    contenders = [
        Contender(
            "sluice",
            bin_dir / "sluice",
            {
                "cniVersion": "1.0.0",
                "name": "bench-sluice",
                "type": "sluice",
                "policy": "off",
                "ipMasq": masq,
                "stateDir": str(work / "state"),
                "bpfDir": bpf_dir,
                "ipam": {"type": "sluice-ipam", "subnet": "10.210.0.0/16"},
            },
        ),
        Contender(
            "ptp",
            bin_dir / "ptp",
            {
                "cniVersion": "1.0.0",
                "name": "bench-ptp",
                "type": "ptp",
                "ipMasq": masq,
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.211.0.0/16",
                    "dataDir": str(work / "host-local"),
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
        ),
    ]
    try:
        for r in range(args.rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for contender in order:
                contender.round(args.pods, bin_dir)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(bpf_dir, ignore_errors=True)
        if not nat_existed and nft_table_exists("ip", "nat"):
            subprocess.run(["nft", "delete", "table", "ip", "nat"], check=False)
        subprocess.run(
            ["nft", "delete", "table", "ip", "sluice_bench-sluice"],
            check=False,
            capture_output=True,
        )

    sluice, ptp = contenders
    print(
        f"ADD/DEL latency, {args.rounds} rounds x {args.pods} pods, one pod at a time, "
        f"ipMasq {'on' if masq else 'off'}"
    )
    print(f"{'plugin':<22}{'ADD median':>12}{'DEL median':>12}")
    for contender in contenders:
        label = contender.label + (" + host-local" if contender.label == "ptp" else " (in-process)")
        print(
            f"{label:<22}{median_ms(contender.add):>10.1f}ms{median_ms(contender.delete):>10.1f}ms"
        )
    print(
        f"{'ratio sluice/ptp':<22}{ratio(sluice.add, ptp.add):>11.2f}x"
        f"{ratio(sluice.delete, ptp.delete):>11.2f}x"
    )


if __name__ == "__main__":
    main()
