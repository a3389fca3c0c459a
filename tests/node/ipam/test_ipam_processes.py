"""sluice-ipam's store under concurrent and killed processes, as plugin calls are.

Several real processes share one SQLite store (or one claim store, across
simulated nodes) while some are SIGKILLed at random points.
"""

from __future__ import annotations

import ipaddress
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ipam import config as ipam_config
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator
from tests.harness.ipam import held, ips, prefix_plugin

# -- several processes, as concurrent plugin calls are ---------------------------------

WORKER = """
import json, sys
sys.path.insert(0, {root!r})
from ipam import config
from ipam.modes import open_allocator
conf = config.from_plugin("net1", json.loads(sys.argv[4]))
name, rounds, keep = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "keep"
i = 0
while rounds < 0 or i < rounds:
    with open_allocator(conf) as allocator:
        allocation, _ = allocator.allocate(f"{{name}}-{{i}}", "eth0")
        print(allocation.ip, flush=True)
        if not keep:
            allocator.release(f"{{name}}-{{i}}", "eth0")
    i += 1
"""


def node_cidr_plugin(tmp_path: Path) -> dict[str, Any]:
    return {
        "stateDir": str(tmp_path),
        "ipam": {"type": "sluice-ipam", "subnet": "10.9.0.0/22", "cooldownSeconds": 0},
    }


def start_worker(
    plugin: dict[str, Any], name: str, rounds: int, keep: bool
) -> subprocess.Popen[str]:
    script = WORKER.format(root=str(Path(__file__).resolve().parents[3]))
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            name,
            str(rounds),
            "keep" if keep else "churn",
            json.dumps(plugin),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_concurrent_processes_never_share_an_address(tmp_path: Path) -> None:
    plugin = node_cidr_plugin(tmp_path)
    churners = [start_worker(plugin, f"churn{i}", 40, keep=False) for i in range(4)]
    keepers = [start_worker(plugin, f"keep{i}", 40, keep=True) for i in range(6)]
    held: list[str] = []
    for proc in keepers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        held += out.split()
    for proc in churners:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    assert len(held) == len(set(held)) == 240
    with open_allocator(ipam_config.from_plugin("net1", plugin)) as a:
        assert sorted(ips(a)) == sorted(held)


def kill_workers_at_random(plugin: dict[str, Any], label: str) -> list[str]:
    """Run 4 workers (2 keeping what they get), SIGKILL them; return what keepers reported."""
    workers = [start_worker(plugin, f"{label}w{i}", -1, keep=bool(i % 2)) for i in range(4)]
    time.sleep(random.uniform(0.2, 0.8))
    for proc in workers:
        proc.send_signal(signal.SIGKILL)
    reported: list[str] = []
    for index, proc in enumerate(workers):
        out, _ = proc.communicate()
        if index % 2:  # keepers: every address they printed was committed
            reported += out.split()
    return reported


def test_sigkill_at_any_point_loses_nothing_committed(tmp_path: Path) -> None:
    plugin = node_cidr_plugin(tmp_path)
    config = ipam_config.from_plugin("net1", plugin)
    for round_ in range(6):
        reported = kill_workers_at_random(plugin, f"r{round_}")
        with open_allocator(config) as allocator:
            db = allocator.store.db
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            stored = ips(allocator)
            assert len(stored) == len(set(stored))
            assert set(reported) <= set(stored), "a committed allocation was lost"
    with open_allocator(config) as allocator:
        allocator.gc(set())
        assert allocator.allocations() == []


def test_many_processes_creating_a_store_at_once(tmp_path: Path) -> None:
    """The first ADDs on a node race to create the store (and switch it to WAL)."""
    for round_ in range(5):
        plugin = node_cidr_plugin(tmp_path / f"round{round_}")
        workers = [start_worker(plugin, f"w{i}", 1, keep=True) for i in range(8)]
        for proc in workers:
            proc.communicate(timeout=60)
            assert proc.returncode == 0


def test_prefix_mode_concurrency_and_kills_across_nodes(tmp_path: Path) -> None:
    plugins = [
        prefix_plugin(tmp_path, node=f"node-{n}", pool="10.30.0.0/20", cooldownSeconds=0)
        for n in "ab"
    ]
    for round_ in range(4):
        for plugin in plugins:
            plugin["label"] = f"{plugin['ipam']['nodeName']}-r{round_}"
        workers = [
            start_worker(
                {k: v for k, v in p.items() if k != "label"},
                f"{p['label']}w{i}",
                25,
                keep=bool(i % 2),
            )
            for p in plugins
            for i in range(3)
        ]
        for proc in workers:
            proc.communicate(timeout=120)
            assert proc.returncode == 0
        kill_workers_at_random(
            {k: v for k, v in plugins[round_ % 2].items() if k != "label"}, f"k{round_}"
        )
    everything: list[str] = []
    blocks: list[str] = []
    for plugin in plugins:
        with open_allocator(
            ipam_config.from_plugin("net1", {k: v for k, v in plugin.items() if k != "label"})
        ) as allocator:
            assert isinstance(allocator, PrefixAllocator)
            mine = held(allocator)
            blocks += mine
            for ip in ips(allocator):
                everything.append(ip)
                assert any(ipaddress.IPv4Address(ip) in ipaddress.IPv4Network(b) for b in mine)
            owners = {str(c.block): c.node for c in allocator.claims.claims()}
            assert all(owners.get(b) == allocator.config.node_name for b in mine)
    assert len(everything) == len(set(everything)), "an address was handed out twice"
    assert len(blocks) == len(set(blocks)), "a block is held by two nodes"
