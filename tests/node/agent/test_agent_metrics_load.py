"""Scrapes cannot starve the CNI path: ADD's median latency through the agent, with
and without 8 scrapers asking for /metrics as fast as they are answered, while
the node's conntrack tables are full (what a scrape used to walk entry by entry).
The figures go to bench/README.md ("Metrics beside ADD")."""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from cni.datapath import bpf
from cni.datapath.maps import Datapath
from cni.datapath.structs import CTEntry, CTKey, ip_be
from tests.harness.agent import AgentNetwork, k8s_args
from tests.harness.cni_run import PodNamespaces

pytestmark = pytest.mark.slow

FILLED_PODS = 8  # pods whose conntrack tables are filled to capacity
ADDS = 15  # ADDs measured per phase
SCRAPERS = 8
MIN_SCRAPES = 40  # the premise: the scrapers really hammered (they manage hundreds)
RATIO = 1.5  # loaded median / quiet median, at most
SLACK = 0.010  # seconds of noise a shared 2-CPU machine adds to a median


def fill_table(dp: Datapath, ifindex: int, base: int) -> int:
    """Live entries in the endpoint's table up to its capacity; how many."""
    fd = dp.conntrack.open_table(ifindex)
    assert fd is not None
    try:
        count = bpf.map_info(fd).max_entries
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        keys = (CTKey * count)(
            *(CTKey(saddr=ip_be("10.214.0.2"), daddr=base + i, sport=4000, dport=80, proto=6)
              for i in range(count))
        )  # fmt: skip
        values = (CTEntry * count)(*(CTEntry(last_seen=now, flags=1) for _ in range(count)))
        bpf.map_update_batch(fd, keys, values)
        return count
    finally:
        os.close(fd)


def timed_add(net: AgentNetwork, pods: PodNamespaces, label: str) -> float:
    """ADD then DEL; the ADD's wall time as the runtime sees it."""
    netns = pods.new()
    cid = f"{label}-{uuid.uuid4().hex[:8]}"
    run = net.network.run(
        "ADD", net.config(), container_id=cid, netns=netns, ifname="eth0",
        cni_args=k8s_args("x", cid),
    ).ok()  # fmt: skip
    net.delete(netns, cid, "x", cid)
    return run.seconds


class Scrapers:
    """Threads asking for ``url`` back to back while ``running`` is set."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.done = 0
        self.failed = 0
        self.inflight = 0
        self.running = threading.Event()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._scrape, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _scrape(self) -> None:
        while not self.stopped.is_set():
            if not self.running.wait(0.1):
                continue
            with self.lock:
                self.inflight += 1
            try:
                urllib.request.urlopen(self.url, timeout=60).read()
                ok = True
            except OSError:
                ok = False
            with self.lock:
                self.inflight -= 1
                self.done += ok
                self.failed += not ok

    def pause(self) -> None:
        """Stop asking, and wait until no scrape is in flight."""
        self.running.clear()
        deadline = time.monotonic() + 120
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.inflight, "scrapes still in flight after 120 s"

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_add_latency_does_not_move_under_parallel_scrapes(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    net = AgentNetwork.create(tmp_path, bin_dir)
    net.agent.extra = ("--metrics-address", f"127.0.0.1:{port}")
    filled = []
    try:
        net.start()
        with Datapath(net.config()["bpfDir"]) as dp:
            entries = 0
            for i in range(FILLED_PODS):
                netns = pods.new()
                cid = f"filled-{i}-{uuid.uuid4().hex[:6]}"
                result = net.add(netns, cid, "x", cid)
                filled.append((netns, cid))
                ifindex = next(e["ifindex"] for e in net.endpoints() if e["containerID"] == cid)
                entries += fill_table(dp, ifindex, ip_be(f"10.{100 + i}.0.0"))
                assert result["ips"]
        # Interleaved, so that the machine's other load weighs on both alike.
        quiet, loaded = [], []
        scrapers = Scrapers(f"http://127.0.0.1:{port}/metrics", SCRAPERS)
        try:
            for _ in range(ADDS):
                scrapers.pause()
                quiet.append(timed_add(net, pods, "quiet"))
                scrapers.running.set()
                time.sleep(0.5)  # every scraper asks
                loaded.append(timed_add(net, pods, "loaded"))
        finally:
            scrapers.stop()
        quiet_p50, loaded_p50 = statistics.median(quiet), statistics.median(loaded)
        print(
            f"\nADD p50: {quiet_p50 * 1000:.1f} ms quiet, {loaded_p50 * 1000:.1f} ms with "
            f"{SCRAPERS} scrapers ({scrapers.done} scrapes, {scrapers.failed} refused) and "
            f"{entries} conntrack entries"
        )
        assert scrapers.done >= MIN_SCRAPES, f"only {scrapers.done} scrapes: no load"
        assert loaded_p50 <= quiet_p50 * RATIO + SLACK, (quiet, loaded)
    finally:
        for netns, cid in filled:
            net.delete(netns, cid, "x", cid)
        net.cleanup()
