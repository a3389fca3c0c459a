#!/usr/bin/env python3
"""DEL latency with an empty conntrack and with 100,000 live conntrack entries.

Each endpoint has its own conntrack table, so DEL drops the pod's table in
one map operation whatever it holds; nothing walks the entries. This
measures it: pods are ADDed and DELeted by the real plugin (exec'd through
cni.spec.invoke, as a runtime does), one at a time, in two interleaved cases:

    empty     no other conntrack entry on the node; the pod's table empty
    100,000   a filler endpoint holds 100,000 live entries, and the pod's own
              table is full (about conntrackPerEndpoint entries: an LRU map
              evicts a little before its size) when it is DELeted

Entries are written from userspace (valid keys, current timestamps), so
the datapath would treat them as live flows. The table shows the medians
and their ratio (target: within 1.5x).

    .venv/bin/python bench/del_conntrack.py [--rounds 5] [--pods 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cni.datapath import bpf, loader
from cni.datapath.maps import Datapath
from cni.datapath.structs import CTEntry, CTKey, Endpoint, ip_be
from cni.spec.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
FILLER_ENTRIES = 100_000
TARGET = 1.5


def fill(dp: Datapath, ifindex: int, count: int, base: int) -> None:
    """``count`` live entries in the endpoint's table."""
    fd = dp.conntrack.open_table(ifindex)
    assert fd is not None
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    try:
        for i in range(count):
            key = CTKey(saddr=ip_be("10.214.0.2"), daddr=base + i, sport=4000, dport=80, proto=6)
            bpf.map_update(fd, key, CTEntry(last_seen=now, flags=1))
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pods", type=int, default=10, help="pods per case and round")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates namespaces and veths")
    pid = os.getpid()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-del-"))
    bpf_dir = f"/sys/fs/bpf/slbench-del-{pid}"
    anchor = f"sldel{pid % 100000}"
    net = f"slbenchdel{pid}"
    config = {
        "cniVersion": "1.1.0",
        "name": net,
        "type": "sluice",
        "policy": "off",
        "ipMasq": False,
        "stateDir": str(work / "state"),
        "bpfDir": bpf_dir,
        "ipam": {"type": "sluice-ipam", "subnet": "10.214.0.0/16"},
    }
    times: dict[str, list[float]] = {"empty": [], "100,000": []}
    pod_entries: list[int] = []
    stack = contextlib.ExitStack()
    with stack:
        stack.callback(shutil.rmtree, work, True)
        stack.callback(shutil.rmtree, bpf_dir, True)
        stack.callback(
            subprocess.run, ["nft", "delete", "table", "ip", f"sluice_{net}"], capture_output=True
        )
        subprocess.run(
            [ROOT / ".venv/bin/sluicectl", "install", "--bin-dir", work / "bin",
             "--conf-dir", work / "net.d"],
            check=True, capture_output=True,
        )  # fmt: skip
        loader.load(bpf_dir)
        dp = stack.enter_context(Datapath(bpf_dir))
        # The filler: an endpoint on a veth of its own with a table of 131,072 entries.
        subprocess.run(["ip", "link", "add", anchor, "type", "veth", "peer", "name", anchor + "p"],
                       check=True)  # fmt: skip
        stack.callback(subprocess.run, ["ip", "link", "del", anchor], capture_output=True)
        filler = int(Path(f"/sys/class/net/{anchor}/ifindex").read_text())
        dp.endpoints.put(filler, Endpoint(ip=ip_be("10.214.255.1")))
        dp.conntrack.create_table(filler, 131072)
        per_pod = dp.config().ct_per_endpoint
        for r in range(args.rounds):
            for case in ("empty", "100,000") if r % 2 == 0 else ("100,000", "empty"):
                dp.conntrack.sweep([filler])
                if case != "empty":
                    started = time.monotonic()
                    fill(dp, filler, FILLER_ENTRIES, ip_be("11.0.0.0"))
                    held = dp.conntrack.fill(filler)
                    assert held and held.entries == FILLER_ENTRIES, held
                    print(f"filled in {time.monotonic() - started:.1f} s", file=sys.stderr)
                for i in range(args.pods):
                    name = f"sldel-{pid}-{r}-{i}"
                    subprocess.run(["ip", "netns", "add", name], check=True)
                    try:
                        env = cni_env("ADD", container_id=name, netns=f"/run/netns/{name}",
                                      ifname="eth0", cni_path=str(work / "bin"))  # fmt: skip
                        added = invoke(str(work / "bin" / "sluice"), env, config)
                        if added.rc != 0:
                            sys.exit(f"ADD failed: {added.stdout}")
                        veth = added.out["interfaces"][0]["name"]
                        ifindex = int(Path(f"/sys/class/net/{veth}/ifindex").read_text())
                        if case != "empty":
                            fill(dp, ifindex, per_pod, ip_be("12.0.0.0"))
                            table = dp.conntrack.fill(ifindex)
                            assert table and table.entries >= per_pod * 0.9, table
                            pod_entries.append(table.entries)
                        env["CNI_COMMAND"] = "DEL"
                        deleted = invoke(str(work / "bin" / "sluice"), env, config)
                        if deleted.rc != 0:
                            sys.exit(f"DEL failed: {deleted.stdout}")
                        times[case].append(deleted.seconds)
                    finally:
                        subprocess.run(["ip", "netns", "del", name], check=False)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    empty, full = (statistics.median(times[c]) * 1000 for c in ("empty", "100,000"))
    print(f"DEL latency, {args.rounds} rounds x {args.pods} pods per case, one pod at a time")
    print(f"{'conntrack':<34}{'DEL median':>12}")
    print(f"{'empty':<34}{empty:>10.1f}ms")
    print(f"{'100,000 live (+ the pod table full)':<34}{full:>10.1f}ms")
    print(
        f"the pod's own table held {min(pod_entries)}-{max(pod_entries)} entries "
        "(the LRU evicts a little before its size)"
    )
    verdict = "met" if full / empty <= TARGET else "NOT met"
    print(f"ratio {full / empty:.2f} (target <= {TARGET}): {verdict}")


if __name__ == "__main__":
    main()
