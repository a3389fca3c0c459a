"""sluice-ipam's node-CIDR allocator and its store, on real SQLite files.

Concurrency and crash tests use separate processes, as plugin calls are.
"""

from __future__ import annotations

import ipaddress
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cni.errors import CNIError
from ipam import config as ipam_config
from ipam.nodecidr import NodeCIDRAllocator
from ipam.store import SCHEMA_VERSION, store_path


def make_config(
    tmp_path: Path, subnet: str = "10.9.0.0/24", **ipam: object
) -> ipam_config.NodeCIDRConfig:
    return ipam_config.parse(
        "net1",
        {"stateDir": str(tmp_path), "ipam": {"type": "sluice-ipam", "subnet": subnet, **ipam}},
    )


def ips(allocator: NodeCIDRAllocator) -> list[str]:
    return sorted((str(a.ip) for a in allocator.allocations()), key=ipaddress.IPv4Address)


def test_lowest_free_address_first_skipping_network_gateway_broadcast(tmp_path: Path) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path, "10.9.0.0/29")) as allocator:
        got = [str(allocator.allocate(f"c{i}", "eth0")[0].ip) for i in range(5)]
        assert got == ["10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"]
        with pytest.raises(CNIError) as err:
            allocator.allocate("c9", "eth0")
        assert err.value.code == 102
        assert "10.9.0.0/29" in err.value.details and "all 5" in err.value.details
        assert allocator.available() == 0


def test_range_and_gateway_are_honoured(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, rangeStart="10.9.0.10", rangeEnd="10.9.0.12", gateway="10.9.0.11"
    )
    assert config.size == 2
    with NodeCIDRAllocator.open(config) as allocator:
        assert [str(allocator.allocate(c, "eth0")[0].ip) for c in "ab"] == [
            "10.9.0.10",
            "10.9.0.12",
        ]
        allocation = allocator.find("a", "eth0")
        assert allocation is not None and allocation.cidr == "10.9.0.10/24"


def test_same_attachment_gets_the_same_address(tmp_path: Path) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path)) as allocator:
        first, created = allocator.allocate("c1", "eth0")
        again, created_again = allocator.allocate("c1", "eth0")
        other, _ = allocator.allocate("c1", "net1")  # another interface of the same pod
        assert created and not created_again
        assert first.ip == again.ip != other.ip


def test_released_addresses_cool_down(tmp_path: Path) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path)) as allocator:
        first, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
        second, _ = allocator.allocate("b", "eth0")
        assert second.ip != first.ip
    with NodeCIDRAllocator.open(make_config(tmp_path, cooldownSeconds=0)) as allocator:
        allocator.release("b", "eth0")
        assert allocator.allocate("c", "eth0")[0].ip == first.ip


def test_cooldown_survives_a_restart(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with NodeCIDRAllocator.open(config) as allocator:
        released, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
    with NodeCIDRAllocator.open(config) as allocator:  # a new process, same store
        assert allocator.allocate("b", "eth0")[0].ip != released.ip


def test_longest_cooled_address_is_reused_when_nothing_else_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path, "10.9.0.0/29")) as allocator:
        for i in range(5):
            allocator.allocate(f"c{i}", "eth0")
        allocator.release("c3", "eth0")
        time.sleep(0.01)
        allocator.release("c1", "eth0")
        assert allocator.available() == 2
        got, _ = allocator.allocate("new", "eth0")
        assert str(got.ip) == "10.9.0.5"  # c3's, released before c1's
        assert "only cooling addresses are left" in caplog.text


def test_gc_releases_attachments_not_listed(tmp_path: Path) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path)) as allocator:
        for cid in "abc":
            allocator.allocate(cid, "eth0")
        released = allocator.gc({("b", "eth0")})
        assert sorted(a.container_id for a in released) == ["a", "c"]
        assert [a.container_id for a in allocator.allocations()] == ["b"]
        assert allocator.gc(set()) and allocator.allocations() == []


def test_a_newer_store_format_is_refused(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    NodeCIDRAllocator.open(config).close()
    with sqlite3.connect(store_path(str(tmp_path), "net1")) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(CNIError) as err:
        NodeCIDRAllocator.open(config)
    assert err.value.code == 103 and "newer" in err.value.details


def test_store_is_durable_wal(tmp_path: Path) -> None:
    with NodeCIDRAllocator.open(make_config(tmp_path)) as allocator:
        db = allocator.store.db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


WORKER = """
import sys
sys.path.insert(0, {root!r})
from ipam import config
from ipam.nodecidr import NodeCIDRAllocator
conf = config.parse("net1", {{"stateDir": {state!r}, "ipam": {{"type": "sluice-ipam",
    "subnet": "10.9.0.0/22", "cooldownSeconds": 0}}}})
name, rounds, keep = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "keep"
i = 0
while rounds < 0 or i < rounds:
    with NodeCIDRAllocator.open(conf) as allocator:
        allocation, _ = allocator.allocate(f"{{name}}-{{i}}", "eth0")
        print(allocation.ip, flush=True)
        if not keep:
            allocator.release(f"{{name}}-{{i}}", "eth0")
    i += 1
"""


def start_worker(tmp_path: Path, name: str, rounds: int, keep: bool) -> subprocess.Popen[str]:
    script = WORKER.format(root=str(Path(__file__).resolve().parent.parent), state=str(tmp_path))
    return subprocess.Popen(
        [sys.executable, "-c", script, name, str(rounds), "keep" if keep else "churn"],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_concurrent_processes_never_share_an_address(tmp_path: Path) -> None:
    churners = [start_worker(tmp_path, f"churn{i}", 40, keep=False) for i in range(4)]
    keepers = [start_worker(tmp_path, f"keep{i}", 40, keep=True) for i in range(6)]
    held: list[str] = []
    for proc in keepers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        held += out.split()
    for proc in churners:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    assert len(held) == len(set(held)) == 240
    with NodeCIDRAllocator.open(make_config(tmp_path, "10.9.0.0/22", cooldownSeconds=0)) as a:
        assert sorted(ips(a)) == sorted(held)


def test_sigkill_at_any_point_loses_nothing_committed(tmp_path: Path) -> None:
    config = make_config(tmp_path, "10.9.0.0/22", cooldownSeconds=0)
    for round_ in range(6):
        workers = [start_worker(tmp_path, f"r{round_}w{i}", -1, keep=bool(i % 2)) for i in range(4)]
        time.sleep(random.uniform(0.2, 0.8))
        for proc in workers:
            proc.send_signal(signal.SIGKILL)
        reported: list[str] = []
        for proc, index in zip(workers, range(4), strict=True):
            out, _ = proc.communicate()
            if index % 2:  # keepers: every address they printed was committed
                reported += out.split()
        with NodeCIDRAllocator.open(config) as allocator:
            db = allocator.store.db
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            stored = ips(allocator)
            assert len(stored) == len(set(stored))
            assert set(reported) <= set(stored), "a committed allocation was lost"
    with NodeCIDRAllocator.open(config) as allocator:
        allocator.gc(set())
        assert allocator.allocations() == []
