#!/usr/bin/env python3
"""ADD and DEL latency of sluice next to the reference plugins (ptp + host-local).

Each plugin is exec'd exactly as a runtime does it, each pod in its own
network namespace:

- one pod at a time (``--pattern one``, the default): each pod ADDed and DELed
  before the next, for sluice in its own process (no agent, "policy": "off"),
  sluice through the node agent ("policy": "enforce", the default), and ptp +
  host-local;
- many live pods (``--pattern live``), as on a node: every pod of a round is
  ADDed, one after the other, and only then are they DELed, one after the
  other, so that each call meets the others' veths, routes, endpoints and
  addresses (and a DEL the deferred work of the DELs before it);
- a burst: 100 pods ADDed at once (then DELed at once), wall time, for the
  agent and for ptp + host-local.

Rounds interleave the contenders (their order rotates) so that machine noise
hits all of them alike; ratios are computed per round and their median is
reported. After the last DEL of a round (or of a burst) returns, the script
counts the addresses the IPAM still holds and then waits, untimed, until the
contender has released everything (the agent finishes a DEL after it has
answered), so that no contender's leftovers run into the next one's calls.

    .venv/bin/python bench/add_del.py [--pattern one|live] [--rounds 5] [--pods 20]
        [--burst 100] [--no-ip-masq] [--attach tcx|tc] [--no-in-process]
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cni.datapath import loader
from cni.net import link
from cni.net.rtnl import Rtnl
from cni.spec.attachment import ALIAS_PREFIX
from cni.spec.invoke import cni_env, invoke
from ipam.store import Store, store_path

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
        self.held: list[int] = []  # addresses still allocated when a round's last DEL returned
        self.drain: list[float] = []  # seconds from then until none was left
        self._stores: list[Store] = []

    def call(self, command: str, cid: str, netns: str, bin_dir: Path) -> float:
        return exec_plugin(self.binary, command, self.config, cid, netns, bin_dir)

    def allocated(self) -> Callable[[], int]:
        """What counts the addresses the contender's IPAM holds (a store opened once)."""
        ipam = self.config["ipam"]
        if ipam["type"] == "host-local":
            directory = Path(ipam["dataDir"]) / self.config["name"]
            return lambda: sum(1 for _ in directory.glob("*.*.*.*"))
        network = self.config["name"]
        store = Store(store_path(self.config["stateDir"], network), network)
        self._stores.append(store)
        return lambda: len(store.allocated_ips())

    def released(self, timeout: float = 30.0) -> tuple[int, float]:
        """(addresses held now, seconds until none is held), then the veths gone too."""
        count = self.allocated()
        held = count()
        started = time.perf_counter()
        while count():
            if time.perf_counter() - started > timeout:
                sys.exit(f"{self.label}: addresses still allocated {timeout} s after DEL")
            time.sleep(0.005)
        drained = time.perf_counter() - started
        settle(self.config["name"])
        return held, drained

    def round(self, pods: int, bin_dir: Path, pattern: str) -> None:
        adds, dels = [], []
        names = [new_netns() for _ in range(pods)]
        prefix = self.label.split()[0]
        calls = [(f"{prefix}-{i}-{n}", f"/run/netns/{n}") for i, n in enumerate(names)]
        try:
            if pattern == "one":
                for cid, netns in calls:
                    adds.append(self.call("ADD", cid, netns, bin_dir))
                    dels.append(self.call("DEL", cid, netns, bin_dir))
                    settle(self.config["name"])
            else:
                adds = [self.call("ADD", cid, netns, bin_dir) for cid, netns in calls]
                dels = [self.call("DEL", cid, netns, bin_dir) for cid, netns in calls]
                held, drained = self.released()
                self.held.append(held)
                self.drain.append(drained)
        finally:
            for name in names:
                subprocess.run(["ip", "netns", "del", name], check=False)
        self.add.append(adds)
        self.delete.append(dels)

    def burst(self, pods: int, bin_dir: Path) -> tuple[float, float, int, float]:
        """Wall seconds for ``pods`` ADDs at once, then as many DELs at once; the
        addresses still held when the last DEL returned and the seconds until none was."""
        names = [new_netns() for _ in range(pods)]
        calls = [(f"burst-{i}-{n}", f"/run/netns/{n}") for i, n in enumerate(names)]
        try:
            with ThreadPoolExecutor(max_workers=pods) as pool:
                started = time.perf_counter()
                list(pool.map(lambda c: self.call("ADD", *c, bin_dir), calls))
                adds = time.perf_counter() - started
                started = time.perf_counter()
                list(pool.map(lambda c: self.call("DEL", *c, bin_dir), calls))
                dels = time.perf_counter() - started
                held, drained = self.released()
        finally:
            for name in names:
                subprocess.run(["ip", "netns", "del", name], check=False)
        return adds, dels, held, drained


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
    parser.add_argument(
        "--pattern",
        choices=("one", "live"),
        default="one",
        help="one: each pod ADDed and DELed before the next; live: a round's pods all "
        "ADDed, then all DELed",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pods", type=int, default=20, help="pods per contender and round")
    parser.add_argument("--burst", type=int, default=100, help="pods in the burst (0: none)")
    parser.add_argument(
        "--no-ip-masq", action="store_true", help="run all without masquerading (ptp's default)"
    )
    parser.add_argument(
        "--attach",
        choices=("tcx", "tc"),
        default="tc",  # what sluicectl install writes unless bandwidth is chained
        help="how sluice's programs go onto pod veths (the datapath's \"attach\") [%(default)s]",
    )
    parser.add_argument(
        "--no-in-process", action="store_true", help="leave out sluice in its own process"
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
    if args.no_in_process:
        del contenders[0]
    agent = start_agent(work, through_agent)
    bursts: dict[str, tuple[float, float, int, float]] = {}
    try:
        for r in range(args.rounds):
            shift = r % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                contender.round(args.pods, bin_dir, args.pattern)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        if args.burst:
            for contender in (agent_mode, ptp, agent_mode, ptp):
                adds, dels, held, drained = contender.burst(args.burst, bin_dir)
                best = bursts.get(contender.label, (adds, dels, held, drained))
                bursts[contender.label] = (
                    min(best[0], adds),
                    min(best[1], dels),
                    max(best[2], held),
                    max(best[3], drained),
                )
            print("bursts done", file=sys.stderr)
    finally:
        agent.terminate()
        agent.wait()
        for contender in contenders:
            for store in contender._stores:
                store.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(bpf_dir, ignore_errors=True)
        if not nat_existed and nft_table_exists("ip", "nat"):
            subprocess.run(["nft", "delete", "table", "ip", "nat"], check=False)
        for name in ("bench-solo", "bench-agent"):
            subprocess.run(
                ["nft", "delete", "table", "ip", f"sluice_{name}"], check=False, capture_output=True
            )

    how = "one pod at a time" if args.pattern == "one" else "all ADDs, then all DELs"
    print(
        f"ADD/DEL latency, {args.rounds} rounds x {args.pods} pods, {how}, "
        f"ipMasq {'on' if masq else 'off'}, sluice attaching with {args.attach}"
    )
    print(f"{'plugin':<22}{'ADD median':>12}{'DEL median':>12}{'ADD ratio':>11}{'DEL ratio':>11}")
    for contender in contenders:
        print(
            f"{contender.label:<22}{median_ms(contender.add):>10.1f}ms"
            f"{median_ms(contender.delete):>10.1f}ms"
            f"{ratio(contender.add, ptp.add):>10.2f}x{ratio(contender.delete, ptp.delete):>10.2f}x"
        )
    if args.pattern == "live":
        print("\nafter the last DEL of a round: addresses still allocated, seconds until none")
        for contender in contenders:
            held = ", ".join(map(str, contender.held))
            drain = ", ".join(f"{d:.2f}" for d in contender.drain)
            print(f"{contender.label:<22}held {held}; released in {drain} s")
    if bursts:
        print(f"\n{args.burst} pods at once (best of 2), wall time")
        print(f"{'plugin':<22}{'ADDs':>10}{'DELs':>10}{'held after':>12}{'released in':>13}")
        for label, (adds, dels, held, drained) in bursts.items():
            print(f"{label:<22}{adds:>9.2f}s{dels:>9.2f}s{held:>12}{drained:>12.2f}s")
        ours, theirs = bursts[agent_mode.label], bursts[ptp.label]
        print(f"{'ratio agent/ptp':<22}{ours[0] / theirs[0]:>9.2f}x{ours[1] / theirs[1]:>9.2f}x")


if __name__ == "__main__":
    main()
