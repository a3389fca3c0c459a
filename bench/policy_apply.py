#!/usr/bin/env python3
"""How fast the agent turns a policy change into enforcement, and what it costs.

For each size (pods on the node: 100, then 1,000), pods are wired through
the plugin and the agent, half in namespace "front", half in "back". Then,
round after round, a change that touches every pod's policy is applied with
the agent's ``apply`` (which returns once the datapath enforces it): a
default-deny for both namespaces plus an allow whose peer selector changes
each round, so every endpoint gets a new rule set. Reported:

- apply latency: from the request to enforcement on every affected endpoint
  (p50, p99 over the rounds);
- per-endpoint install latency (compile and switch one endpoint), p50 and
  p99 from the agent's own histogram;
- the agent's resident memory with that many endpoints.

    .venv/bin/python bench/policy_apply.py [--sizes 100,1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from cni.datapath import loader
from cni.plugin.client import call
from cni.spec.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
SLUICECTL = ROOT / ".venv" / "bin" / "sluicectl"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def histogram_quantiles(metrics: str, name: str, step: str) -> tuple[float, float]:
    """p50 and p99 of one histogram (upper bucket bounds), from the metrics text."""
    pattern = re.compile(rf'{name}_bucket{{le="([^"]+)",step="{step}"}} (\S+)')
    buckets = [(float(le), float(count)) for le, count in pattern.findall(metrics)]
    total = buckets[-1][1]
    quantile = [next(le for le, count in buckets if count >= q * total) for q in (0.5, 0.99)]
    return quantile[0], quantile[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates namespaces and veths")
    for size in map(int, args.sizes.split(",")):
        run_size(size, args.rounds)


def run_size(size: int, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="sluice-policy-bench-"))
    bin_dir = work / "bin"
    bpf_dir = f"/sys/fs/bpf/slpolicy-{os.getpid()}"
    name = f"polbench{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [SLUICECTL, "install", "--bin-dir", bin_dir, "--conf-dir", work / "net.d"],
        check=True,
        capture_output=True,
    )
    loader.load(bpf_dir)
    sock = str(work / "run" / "agent.sock")
    config = {
        "cniVersion": "1.1.0",
        "name": name,
        "type": "sluice",
        "policy": "enforce",
        "ipMasq": False,
        "stateDir": str(work / "state"),
        "bpfDir": bpf_dir,
        "agentSocket": sock,
        "ipam": {"type": "sluice-ipam", "subnet": "10.216.0.0/20"},
    }
    plugin = {k: v for k, v in config.items() if k not in ("name", "cniVersion")}
    conflist = work / "net.conflist"
    conflist.write_text(json.dumps({"cniVersion": "1.1.0", "name": name, "plugins": [plugin]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (work / "agent.log").open("wb")
    agent = subprocess.Popen(
        [SLUICECTL, "agent", "--conf", conflist, "--metrics-address", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=log,
    )
    netnses: list[str] = []
    try:
        while not os.path.exists(sock):
            if agent.poll() is not None:
                sys.exit((work / "agent.log").read_text())
            time.sleep(0.05)
        netnses = [f"slpb-{uuid.uuid4().hex[:10]}" for _ in range(size)]
        for netns in netnses:
            subprocess.run(["ip", "netns", "add", netns], check=True)

        def add(i: int) -> None:
            namespace = "front" if i % 2 else "back"
            env = cni_env(
                "ADD",
                container_id=f"c{i}",
                netns=f"/run/netns/{netnses[i]}",
                ifname="eth0",
                cni_path=str(bin_dir),
                cni_args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=p{i}",
            )
            invoke(str(bin_dir / "sluice"), env, config).ok()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(add, range(size)))
        wired = time.perf_counter() - started
        pods = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"p{i}",
                    "namespace": "front" if i % 2 else "back",
                    "labels": {"app": f"app{i % 10}", "tier": "front" if i % 2 else "back"},
                },
            }
            for i in range(size)
        ]
        base = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in ("front", "back")
        ]
        call(sock, {"v": 1, "op": "apply", "manifest": yaml.safe_dump_all(base + pods)}, 600)
        latencies = []
        for r in range(rounds):
            documents = []
            for ns in ("front", "back"):
                documents.append(
                    {
                        "apiVersion": "networking.k8s.io/v1",
                        "kind": "NetworkPolicy",
                        "metadata": {"name": "shape", "namespace": ns},
                        "spec": {
                            "podSelector": {},
                            "policyTypes": ["Ingress", "Egress"],
                            "ingress": [
                                {
                                    "from": [
                                        {
                                            "namespaceSelector": {},
                                            "podSelector": {"matchLabels": {"app": f"app{r % 10}"}},
                                        }
                                    ],
                                    "ports": [{"port": 80 + r}],
                                }
                            ],
                            "egress": [{"to": [{"namespaceSelector": {}}]}],
                        },
                    }
                )
            started = time.perf_counter()
            answer = call(
                sock, {"v": 1, "op": "apply", "manifest": yaml.safe_dump_all(documents)}, 600
            )
            latencies.append(time.perf_counter() - started)
            assert answer.get("endpoints") == size, answer
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
        install = histogram_quantiles(metrics.decode(), "sluice_policy_duration_seconds", "install")
        print(f"\n{size} pods (wired through the agent in {wired:.1f} s)")
        print(
            f"  apply -> enforced on all {size}: p50 {statistics.median(latencies) * 1000:.0f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms ({rounds} rounds)"
        )
        print(
            f"  one endpoint's install: p50 <= {install[0] * 1000:.1f} ms, "
            f"p99 <= {install[1] * 1000:.1f} ms (histogram bucket bounds)"
        )
        print(f"  agent resident memory: {rss_mb(agent.pid):.1f} MB")
    finally:
        for i, netns in enumerate(netnses):
            env = cni_env("DEL", container_id=f"c{i}", ifname="eth0", cni_path=str(bin_dir))
            invoke(str(bin_dir / "sluice"), env, config)
            subprocess.run(["ip", "netns", "del", netns], check=False)
        agent.terminate()
        agent.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(bpf_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
