"""sluice-ipam's allocators and their store, on real SQLite files in one process
(several processes and SIGKILLs: tests/node/ipam/test_ipam_processes.py)."""

from __future__ import annotations

import ipaddress
import sqlite3
import time
from pathlib import Path

import pytest

from ipam.errors import NoAddress, StoreError
from ipam.modes import open_allocator
from ipam.store import MIGRATIONS, SCHEMA_VERSION, store_path
from tests.harness.clock import SimulatedClock
from tests.harness.ipam import held, ips, make_config, open_prefix


def test_lowest_free_address_first_skipping_network_gateway_broadcast(tmp_path: Path) -> None:
    with open_allocator(make_config(tmp_path, "10.9.0.0/29")) as allocator:
        got = [str(allocator.allocate(f"c{i}", "eth0")[0].ip) for i in range(5)]
        assert got == ["10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"]
        with pytest.raises(NoAddress) as err:
            allocator.allocate("c9", "eth0")
        assert "10.9.0.0/29" in str(err.value) and "all 5" in str(err.value)
        assert "all 5 are allocated" in (allocator.unavailable_reason() or "")


def test_range_and_gateway_are_honoured(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, rangeStart="10.9.0.10", rangeEnd="10.9.0.12", gateway="10.9.0.11"
    )
    assert config.size == 2
    with open_allocator(config) as allocator:
        assert [str(allocator.allocate(c, "eth0")[0].ip) for c in "ab"] == [
            "10.9.0.10",
            "10.9.0.12",
        ]
        allocation = allocator.find("a", "eth0")
        assert allocation is not None and allocation.cidr == "10.9.0.10/24"


def test_same_attachment_gets_the_same_address(tmp_path: Path) -> None:
    with open_allocator(make_config(tmp_path)) as allocator:
        first, created = allocator.allocate("c1", "eth0")
        again, created_again = allocator.allocate("c1", "eth0")
        other, _ = allocator.allocate("c1", "net1")  # another interface of the same pod
        assert created and not created_again
        assert first.ip == again.ip != other.ip


def test_released_addresses_cool_down(tmp_path: Path) -> None:
    with open_allocator(make_config(tmp_path)) as allocator:
        first, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
        second, _ = allocator.allocate("b", "eth0")
        assert second.ip != first.ip
    with open_allocator(make_config(tmp_path, cooldownSeconds=0)) as allocator:
        allocator.release("b", "eth0")
        assert allocator.allocate("c", "eth0")[0].ip == first.ip


def test_cooldown_survives_a_restart(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with open_allocator(config) as allocator:
        released, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
    with open_allocator(config) as allocator:  # a new process, same store
        assert allocator.allocate("b", "eth0")[0].ip != released.ip


def test_longest_cooled_address_is_reused_when_nothing_else_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with open_allocator(make_config(tmp_path, "10.9.0.0/29")) as allocator:
        for i in range(5):
            allocator.allocate(f"c{i}", "eth0")
        allocator.release("c3", "eth0")
        time.sleep(0.01)
        allocator.release("c1", "eth0")
        assert allocator.unavailable_reason() is None
        got, _ = allocator.allocate("new", "eth0")
        assert str(got.ip) == "10.9.0.5"  # c3's, released before c1's
        assert "only cooling addresses are left" in caplog.text


def test_gc_releases_attachments_not_listed(tmp_path: Path) -> None:
    with open_allocator(make_config(tmp_path)) as allocator:
        for cid in "abc":
            allocator.allocate(cid, "eth0")
        released = allocator.gc({("b", "eth0")})
        assert sorted(a.container_id for a in released) == ["a", "c"]
        assert [a.container_id for a in allocator.allocations()] == ["b"]
        assert allocator.gc(set()) and allocator.allocations() == []


def test_a_newer_store_format_is_refused(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    open_allocator(config).close()
    with sqlite3.connect(store_path(str(tmp_path), "net1")) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as err:
        open_allocator(config)
    assert "newer" in str(err.value)


def test_store_is_durable_wal(tmp_path: Path) -> None:
    with open_allocator(make_config(tmp_path)) as allocator:
        db = allocator.store.db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_format_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = store_path(str(tmp_path), "net1")
    Path(path).parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        for statement in MIGRATIONS[1].split(";"):
            db.execute(statement)
        db.execute("INSERT INTO allocations VALUES ('10.9.0.7', 'old', 'eth0', 1.0, '', '')")
        db.execute("PRAGMA user_version=1")
    with open_allocator(make_config(tmp_path)) as allocator:
        assert ips(allocator) == ["10.9.0.7"]
        assert allocator.store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# -- prefix mode -----------------------------------------------------------------


def test_prefix_blocks_are_claimed_only_when_needed(tmp_path: Path) -> None:
    with open_prefix(tmp_path, warmPrefixes=0) as allocator:
        assert held(allocator) == []
        first, _ = allocator.allocate("c0", "eth0")
        assert first.cidr == "10.30.0.0/32"
        assert held(allocator) == ["10.30.0.0/28"]
        for i in range(1, 16):
            allocator.allocate(f"c{i}", "eth0")
        assert held(allocator) == ["10.30.0.0/28"]  # 16 pods, still one block
        allocator.allocate("c16", "eth0")
        assert held(allocator) == ["10.30.0.0/28", "10.30.0.16/28"]


def test_prefix_keeps_a_warm_block(tmp_path: Path) -> None:
    with open_prefix(tmp_path) as allocator:  # warmPrefixes defaults to 1
        allocator.allocate("c0", "eth0")
        assert held(allocator) == ["10.30.0.0/28", "10.30.0.16/28"]
        for i in range(1, 16):
            allocator.allocate(f"c{i}", "eth0")
        allocator.allocate("c16", "eth0")  # goes into the warm block; a new one is claimed
        assert held(allocator) == ["10.30.0.0/28", "10.30.0.16/28", "10.30.0.32/28"]


def test_prefix_fills_the_fullest_block_first(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with open_prefix(tmp_path, clock, warmPrefixes=0, cooldownSeconds=0) as allocator:
        for i in range(20):  # block A full, block B holds 4
            allocator.allocate(f"c{i}", "eth0")
        for i in (1, 2, 3):
            allocator.release(f"c{i}", "eth0")  # A now holds 13
        clock.advance(1)
        got = [str(allocator.allocate(f"n{i}", "eth0")[0].ip) for i in range(3)]
        assert got == ["10.30.0.1", "10.30.0.2", "10.30.0.3"]  # A refilled, not B


def test_prefix_returns_an_empty_block_after_cooldown(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with open_prefix(tmp_path, clock, warmPrefixes=0, cooldownSeconds=120) as allocator:
        for i in range(17):
            allocator.allocate(f"c{i}", "eth0")
        allocator.release("c16", "eth0")  # the second block is empty but cooling
        assert held(allocator) == ["10.30.0.0/28", "10.30.0.16/28"]
        clock.advance(121)
        allocator.gc({(f"c{i}", "eth0") for i in range(16)})
        assert held(allocator) == ["10.30.0.0/28"]
        assert [c.block for c in allocator.claims.claims()] == [
            ipaddress.IPv4Network("10.30.0.0/28")
        ]


def test_prefix_keeps_the_warm_reserve_when_draining(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with open_prefix(tmp_path, clock, warmPrefixes=1, cooldownSeconds=0) as allocator:
        for i in range(40):
            allocator.allocate(f"c{i}", "eth0")
        assert len(held(allocator)) == 4  # 16 + 16 + 8, plus the warm one
        allocator.gc(set())
        assert len(held(allocator)) == 1


def test_fragmented_pool_gives_a_clear_error_and_stats(tmp_path: Path) -> None:
    """Two nodes hold every /28 of a /26, half full: addresses left, no block to claim."""
    from ipam.report import network_report

    a = open_prefix(tmp_path, node="node-a", pool="10.30.0.0/26", warmPrefixes=0)
    b = open_prefix(tmp_path, node="node-b", pool="10.30.0.0/26", warmPrefixes=0)
    with a, b:
        for i in range(17):
            a.allocate(f"a{i}", "eth0")
            b.allocate(f"b{i}", "eth0")
        for i in range(17, 32):
            a.allocate(f"a{i}", "eth0")
        with pytest.raises(NoAddress) as err:
            a.allocate("one-more", "eth0")
        message = (
            "pool 10.30.0.0/26 has 15 free addresses but no free aligned /28 "
            "(the largest free aligned block is 10.30.0.56/29)"
        )  # b holds 10.30.0.48/28 with .48 in use: .49, .50/31, .52/30 and .56/29 are free
        assert str(err.value) == message
        assert a.unavailable_reason() == message
        assert b.unavailable_reason() is None  # b still has room in its own block
        stats = network_report(a)["stats"]
        assert stats == {
            "allocated": 32,
            "free": 15,
            "freeAlignedBlocks": 0,
            "largestFreeBlock": None,
            "largestFreeAddressBlock": "10.30.0.56/29",
            "prefixesHeld": 2,
            "prefixesMinimum": 2,
            "packing": 1.0,
        }


def test_a_claim_the_node_did_not_record_is_adopted(tmp_path: Path) -> None:
    with open_prefix(tmp_path, warmPrefixes=0) as allocator:
        # A crash right after the claim store committed: the claim exists, the
        # node's store never heard of it.
        block = allocator.claims.claim("node-a", "net1")
        assert block is not None and held(allocator) == []
        allocator.allocate("c0", "eth0")
        assert held(allocator) == [str(block)]


def test_a_recorded_block_without_its_claim_is_dropped_or_claimed_again(tmp_path: Path) -> None:
    clock = SimulatedClock()
    with open_prefix(tmp_path, clock, warmPrefixes=1, cooldownSeconds=0) as allocator:
        allocator.allocate("c0", "eth0")
        busy_block, empty_block = (ipaddress.IPv4Network(b) for b in held(allocator))
        # A crash while giving blocks back: the claims are gone, the records stay.
        allocator.claims.release(busy_block, "node-a")
        allocator.claims.release(empty_block, "node-a")
        allocator.allocate("c1", "eth0")
        owners = {c.block: c.node for c in allocator.claims.claims()}
        assert owners[busy_block] == "node-a"  # it holds c0: claimed back
        assert str(busy_block) in held(allocator)
        assert all(owners.get(ipaddress.IPv4Network(b)) == "node-a" for b in held(allocator))


def test_a_wall_clock_step_neither_ends_a_cooldown_nor_ages_an_allocation(
    tmp_path: Path,
) -> None:
    from ipam.check import LEAK_GRACE_SECONDS, check_attachments

    clock = SimulatedClock()
    config = make_config(tmp_path, "10.9.0.0/29", cooldownSeconds=120)
    with open_allocator(config, clock) as allocator:
        first, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
        clock.step_wall(3600)  # NTP, an operator, a resumed VM: an hour ahead
        assert str(first.ip) in allocator.cooling()
        assert allocator.allocate("b", "eth0")[0].ip != first.ip
        # A fresh allocation without its veth is not taken for a leak either.
        young = check_attachments(allocator, dict, repair=True, remove_attachment=print)
        assert [f.repaired for f in young] == [False]
        clock.advance(LEAK_GRACE_SECONDS + 1)
        old = check_attachments(allocator, dict, repair=True, remove_attachment=print)
        assert [f.repaired for f in old] == [True] and allocator.allocations() == []
        clock.advance(120)
        assert str(first.ip) not in allocator.cooling()


def test_the_lowest_gap_among_allocated_and_cooling_addresses_is_chosen(
    tmp_path: Path,
) -> None:
    clock = SimulatedClock()
    with open_allocator(make_config(tmp_path, cooldownSeconds=60), clock) as allocator:
        for name in "abcdef":  # .2 to .7
            allocator.allocate(name, "eth0")
        allocator.release("b", "eth0")  # .3 cools
        allocator.release("d", "eth0")  # .5 cools
        assert str(allocator.allocate("g", "eth0")[0].ip) == "10.9.0.8"
        clock.advance(61)
        assert str(allocator.allocate("h", "eth0")[0].ip) == "10.9.0.3"
        assert str(allocator.allocate("i", "eth0")[0].ip) == "10.9.0.5"


def test_cooled_addresses_are_forgotten_by_boot_time_within_a_boot_and_wall_time_across(
    tmp_path: Path,
) -> None:
    """The store forgets cooled addresses in SQL: the same rule as ``Instant.since``."""
    clock = SimulatedClock()
    config = make_config(tmp_path, cooldownSeconds=120)
    with open_allocator(config, clock) as allocator:
        first, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
        clock.step_wall(3600)  # the wall clock alone jumps: still cooling
        allocator.allocate("b", "eth0")
        assert str(first.ip) in allocator.store.cooling_ips()
        clock.advance(119)
        allocator.allocate("c", "eth0")
        assert str(first.ip) in allocator.store.cooling_ips()
        clock.advance(1)  # 120 s since boot time of the release: cooled
        allocator.allocate("d", "eth0")
        assert str(first.ip) not in allocator.store.cooling_ips()

        second, _ = allocator.allocate("e", "eth0")
        allocator.release("e", "eth0")
        clock.reboot(downtime=60)  # across a boot, only the wall clock counts
        allocator.allocate("f", "eth0")
        assert str(second.ip) in allocator.store.cooling_ips()
        clock.advance(60)
        allocator.allocate("g", "eth0")
        assert str(second.ip) not in allocator.store.cooling_ips()


def test_after_a_reboot_only_the_wall_clock_counts(tmp_path: Path) -> None:
    clock = SimulatedClock()
    config = make_config(tmp_path, "10.9.0.0/29", cooldownSeconds=120)
    with open_allocator(config, clock) as allocator:
        first, _ = allocator.allocate("a", "eth0")
        allocator.release("a", "eth0")
        clock.reboot(downtime=60)
        assert str(first.ip) in allocator.cooling()
        clock.advance(61)
        assert str(first.ip) not in allocator.cooling()
