#!/usr/bin/env python3
"""ADD and DEL latency of sluice next to the reference plugins (ptp + host-local).

Each plugin is exec'd exactly as a runtime does it, each pod in its own
network namespace:

- one pod at a time: sluice in its own process (no agent, "policy": "off"),
  sluice through the node agent ("policy": "enforce", the default), and ptp +
  host-local. Rounds interleave the contenders (their order rotates) so that
  machine noise hits all of them alike; ratios are computed per round and
  their median is reported;
- a burst: 100 pods ADDed at once (then DELed at once), wall time, for the
  agent and for ptp + host-local.

    .venv/bin/python bench/add_del.py [--rounds 5] [--pods 20] [--burst 100] [--no-ip-masq]
        [--attach tcx|tc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cni.datapath import loader
from cni.net import link
from cni.net.rtnl import Rtnl
from cni.spec.attachment import ALIAS_PREFIX
from cni.spec.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path("/usr/lib/cni")
SLUICECTL = ROOT / ".venv" / "bin" / "sluicectl"


def exec_plugin(
    binary: Path, command: str, config: dict, container_id: str, netns: str, bin_dir: Path
) -> float:
    """Seconds one call took, run as a runtime runs it; exit on failure."""
    env = cni_env(
        command,
        container_id=container_id,
        netns=netns,
        ifname="eth0",
        cni_path=str(bin_dir),
        cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container_id}",
    )
    run = invoke(str(binary), env, config)
    if run.rc != 0:
        sys.exit(f"{binary.name} {command} failed: {run.stdout} {run.stderr}")
    return run.seconds


def settle(network: str, timeout: float = 30.0) -> None:
    """Wait, untimed, until the agent has deleted the veths its DELs cut off, so that
    its deferred kernel work does not run into the next contender's calls."""
    deadline = time.monotonic() + timeout
    with Rtnl() as rtnl:
        while link.links_with_alias(rtnl, f"{ALIAS_PREFIX}{network}/"):
            if time.monotonic() > deadline:
                sys.exit(f"veths of {network} left behind after DEL")
            time.sleep(0.01)


def new_netns() -> str:
    name = f"slb-{uuid.uuid4().hex[:10]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    return name


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
            name = new_netns()
            netns = f"/run/netns/{name}"
            cid = f"{self.label.split()[0]}-{i}-{name}"
            try:
                adds.append(exec_plugin(self.binary, "ADD", self.config, cid, netns, bin_dir))
                dels.append(exec_plugin(self.binary, "DEL", self.config, cid, netns, bin_dir))
                settle(self.config["name"])
            finally:
                subprocess.run(["ip", "netns", "del", name], check=False)
        self.add.append(adds)
        self.delete.append(dels)

    def burst(self, pods: int, bin_dir: Path) -> tuple[float, float]:
        """Wall seconds for ``pods`` ADDs at once, then as many DELs at once."""
        names = [new_netns() for _ in range(pods)]
        calls = [(f"burst-{i}-{n}", f"/run/netns/{n}") for i, n in enumerate(names)]
        try:
            with ThreadPoolExecutor(max_workers=pods) as pool:
                started = time.perf_counter()
                list(
                    pool.map(
                        lambda c: exec_plugin(self.binary, "ADD", self.config, *c, bin_dir), calls
                    )
                )
                adds = time.perf_counter() - started
                started = time.perf_counter()
                list(
                    pool.map(
                        lambda c: exec_plugin(self.binary, "DEL", self.config, *c, bin_dir), calls
                    )
                )
                dels = time.perf_counter() - started
                settle(self.config["name"])
        finally:
            for name in names:
                subprocess.run(["ip", "netns", "del", name], check=False)
        return adds, dels


def nft_table_exists(family: str, name: str) -> bool:
    proc = subprocess.run(["nft", "list", "table", family, name], capture_output=True, check=False)
    return proc.returncode == 0


def median_ms(samples: list[list[float]]) -> float:
    return statistics.median(x for round_ in samples for x in round_) * 1000


def ratio(ours: list[list[float]], theirs: list[list[float]]) -> float:
    return statistics.median(
        statistics.median(a) / statistics.median(b) for a, b in zip(ours, theirs, strict=True)
    )


def start_agent(work: Path, config: dict) -> subprocess.Popen[bytes]:
    plugin = {k: v for k, v in config.items() if k not in ("name", "cniVersion")}
    conflist = work / "agent.conflist"
    conflist.write_text(
        json.dumps(
            {"cniVersion": config["cniVersion"], "name": config["name"], "plugins": [plugin]}
        )
    )
    log = (work / "agent.log").open("wb")
    agent = subprocess.Popen([SLUICECTL, "agent", "--conf", str(conflist)], stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while not os.path.exists(config["agentSocket"]):
        if agent.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the agent did not start: {(work / 'agent.log').read_text()}")
        time.sleep(0.05)
    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pods", type=int, default=20, help="pods per contender and round")
    parser.add_argument("--burst", type=int, default=100, help="pods in the burst (0: none)")
    parser.add_argument(
        "--no-ip-masq", action="store_true", help="run all without masquerading (ptp's default)"
    )
    parser.add_argument(
        "--attach",
        choices=("tcx", "tc"),
        default="tcx",
        help="how sluice's programs go onto pod veths (the datapath's \"attach\")",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates namespaces and veths")

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    bin_dir = work / "bin"
    subprocess.run(
        [SLUICECTL, "install", "--bin-dir", bin_dir, "--conf-dir", work / "net.d"],
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

    def sluice_config(name: str, policy: str, subnet: str) -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": name,
            "type": "sluice",
            "policy": policy,
            "ipMasq": masq,
            "stateDir": str(work / "state"),
            "bpfDir": bpf_dir,
            "agentSocket": str(work / "run" / f"{name}.sock"),
            "ipam": {"type": "sluice-ipam", "subnet": subnet},
            "datapath": {"attach": args.attach},
        }

    in_process = sluice_config("bench-solo", "off", "10.210.0.0/16")
    through_agent = sluice_config("bench-agent", "enforce", "10.212.0.0/16")
    contenders = [
        Contender("sluice (in-process)", bin_dir / "sluice", in_process),
        Contender("sluice (agent)", bin_dir / "sluice", through_agent),
        Contender(
            "ptp + host-local",
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
    _, agent_mode, ptp = contenders
    agent = start_agent(work, through_agent)
    bursts: dict[str, tuple[float, float]] = {}
    try:
        for r in range(args.rounds):
            shift = r % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                contender.round(args.pods, bin_dir)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        if args.burst:
            for contender in (agent_mode, ptp, agent_mode, ptp):
                adds, dels = contender.burst(args.burst, bin_dir)
                best = bursts.get(contender.label, (adds, dels))
                bursts[contender.label] = (min(best[0], adds), min(best[1], dels))
            print("bursts done", file=sys.stderr)
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(bpf_dir, ignore_errors=True)
        if not nat_existed and nft_table_exists("ip", "nat"):
            subprocess.run(["nft", "delete", "table", "ip", "nat"], check=False)
        for name in ("bench-solo", "bench-agent"):
            subprocess.run(
                ["nft", "delete", "table", "ip", f"sluice_{name}"], check=False, capture_output=True
            )

    print(
        f"ADD/DEL latency, {args.rounds} rounds x {args.pods} pods, one pod at a time, "
        f"ipMasq {'on' if masq else 'off'}, sluice attaching with {args.attach}"
    )
    print(f"{'plugin':<22}{'ADD median':>12}{'DEL median':>12}{'ADD ratio':>11}{'DEL ratio':>11}")
    for contender in contenders:
        print(
            f"{contender.label:<22}{median_ms(contender.add):>10.1f}ms"
            f"{median_ms(contender.delete):>10.1f}ms"
            f"{ratio(contender.add, ptp.add):>10.2f}x{ratio(contender.delete, ptp.delete):>10.2f}x"
        )
    if bursts:
        print(f"\n{args.burst} pods at once (best of 2), wall time")
        print(f"{'plugin':<22}{'ADDs':>10}{'DELs':>10}")
        for label, (adds, dels) in bursts.items():
            print(f"{label:<22}{adds:>9.2f}s{dels:>9.2f}s")
        ours, theirs = bursts[agent_mode.label], bursts[ptp.label]
        print(f"{'ratio agent/ptp':<22}{ours[0] / theirs[0]:>9.2f}x{ours[1] / theirs[1]:>9.2f}x")


if __name__ == "__main__":
    main()
