"""Where prefix claims live (``claimStore``), what a process without the agent may do
with claims kept in the API, and the free-space arithmetic of fragmented pools."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.spec.errors import ERR_TRY_AGAIN, from_ipam
from ipam import claim_stores
from ipam import config as ipam_config
from ipam.claims import LocalClaimStore
from ipam.errors import ClaimsUnavailable, InvalidConfig
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator
from ipam.space import free_in_block, largest_network, runs, unclaimed_space
from tests.harness.clock import SimulatedClock
from tests.harness.ipam import held, open_prefix

Net = ipaddress.IPv4Network


def api_config(tmp_path: Path, **ipam: Any) -> ipam_config.PrefixConfig:
    config = ipam_config.from_plugin(
        "net1",
        {
            "stateDir": str(tmp_path),
            "ipam": {
                "type": "sluice-ipam",
                "mode": "prefix",
                "pool": "10.40.0.0/24",
                "claimStore": "kubernetes",
                "nodeName": "node-a",
                **ipam,
            },
        },
    )
    assert isinstance(config, ipam_config.PrefixConfig)
    return config


@pytest.fixture(autouse=True)
def nobody_provides() -> Iterator[None]:
    claim_stores.provide(None)
    yield
    claim_stores.provide(None)


# -- configuration -------------------------------------------------------------------------


def test_claim_store_defaults_to_local_and_kubernetes_is_named(tmp_path: Path) -> None:
    local = ipam_config.from_plugin(
        "n", {"ipam": {"type": "sluice-ipam", "mode": "prefix", "pool": "10.0.0.0/16"}}
    )
    assert isinstance(local, ipam_config.PrefixConfig) and local.claim_store == "local"
    assert local.to_json()["claimsDir"] == "/var/lib/sluice/claims"
    api = api_config(tmp_path)
    assert api.claim_store == "kubernetes"
    assert "claimsDir" not in api.to_json()  # the snapshot parses again
    assert ipam_config.parse("net1", {**api.to_json(), "stateDir": str(tmp_path)}) == api


@pytest.mark.parametrize(
    ("ipam", "says"),
    [
        ({"claimStore": "etcd"}, "invalid \"ipam.claimStore\" 'etcd'"),
        ({"claimsDir": "/shared/nfs"}, '"ipam.claimsDir" names a local claim store'),
        ({"nodeName": "Node_A"}, "a Kubernetes node name"),
        ({"nodeName": "n" * 64}, "at most 63"),
    ],
)
def test_claim_store_errors_say_what_is_wrong(
    tmp_path: Path, ipam: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidConfig) as err:
        api_config(tmp_path, **ipam)
    assert says in str(err.value)


# -- without the agent ------------------------------------------------------------------------


def test_without_the_agent_an_add_fails_and_never_falls_back_to_a_local_store(
    tmp_path: Path,
) -> None:
    config = api_config(tmp_path)
    with open_allocator(config, SimulatedClock()) as allocator:
        with pytest.raises(ClaimsUnavailable) as err:
            allocator.allocate("c0", "eth0")
        assert '"ipam.claimStore": "kubernetes"' in str(err.value)
        assert "sluicectl agent" in str(err.value)
        assert from_ipam(err.value).code == ERR_TRY_AGAIN
        with pytest.raises(ClaimsUnavailable):
            allocator.unavailable_reason()  # STATUS answers 50 with this message
    assert not (tmp_path / "claims").exists()


def test_a_del_without_the_agent_releases_and_leaves_the_block_to_the_agent(
    tmp_path: Path,
) -> None:
    config = api_config(tmp_path, warmPrefixes=0, cooldownSeconds=0)

    def agents_store(c: ipam_config.PrefixConfig) -> LocalClaimStore:
        # A real claim store standing for the agent's API store (which tests/node/kube
        # runs against a real API server): what matters here is who may reach it.
        return LocalClaimStore(str(tmp_path / "agent-claims"), c.pool, c.prefix_length)

    def claimed() -> list[Net]:
        store = agents_store(config)
        try:
            return [c.block for c in store.claims()]
        finally:
            store.close()

    claim_stores.provide(agents_store)  # the agent's process
    with open_allocator(config, SimulatedClock()) as allocator:
        allocator.allocate("c0", "eth0")
    assert claimed() == [Net("10.40.0.0/28")]
    claim_stores.provide(None)  # the agent is gone: a DEL runs in the plugin's process
    with open_allocator(config, SimulatedClock()) as allocator:
        assert allocator.release("c0", "eth0") is not None
        assert allocator.allocations() == []
        assert held(allocator) == ["10.40.0.0/28"]  # still recorded, still claimed
        allocator.gc(set())
    assert claimed() == [Net("10.40.0.0/28")]
    claim_stores.provide(agents_store)  # the agent is back: it gives the block back
    with open_allocator(config, SimulatedClock()) as allocator:
        assert isinstance(allocator, PrefixAllocator)
        assert allocator.reconcile() == []
    assert claimed() == []


# -- free space ---------------------------------------------------------------------------------


def test_unclaimed_space_rounds_inward_to_whole_blocks() -> None:
    pool = Net("10.0.0.0/24")
    claimed = [Net("10.0.0.16/28"), Net("10.0.0.64/26"), Net("10.0.0.200/30"), Net("10.9.0.0/28")]
    assert unclaimed_space(pool, 28, claimed) == [
        Net("10.0.0.0/28"),
        Net("10.0.0.32/27"),
        Net("10.0.0.128/26"),
        Net("10.0.0.208/28"),  # 10.0.0.192/28 overlaps the /30
        Net("10.0.0.224/27"),
    ]
    assert unclaimed_space(pool, 28, []) == [pool]
    assert unclaimed_space(pool, 28, [Net("10.0.0.0/16")]) == []


def test_free_parts_of_a_block_and_the_largest() -> None:
    block = Net("10.0.0.0/28")
    used = [ipaddress.IPv4Address("10.0.0.0"), ipaddress.IPv4Address("10.0.0.5")]
    free = free_in_block(block, used)
    assert free == (
        Net("10.0.0.1/32"),
        Net("10.0.0.2/31"),
        Net("10.0.0.4/32"),
        Net("10.0.0.6/31"),
        Net("10.0.0.8/29"),
    )
    assert largest_network(free) == Net("10.0.0.8/29")
    assert largest_network([]) is None
    assert runs([3, 1, 2]) == [Net("0.0.0.1/32"), Net("0.0.0.2/31")]


def test_the_fragmented_pools_message_names_its_largest_free_block(tmp_path: Path) -> None:
    """Three nodes hold the four /28 of a /26; the one with room has a /30 free."""
    pool = "10.30.0.0/26"
    nodes = [open_prefix(tmp_path, node=f"n{i}", pool=pool, warmPrefixes=0) for i in range(3)]
    try:
        a, b, c = nodes
        for i in range(32):
            a.allocate(f"a{i}", "eth0")  # two full blocks
        for i in range(16):
            b.allocate(f"b{i}", "eth0")
        for i in range(12):
            c.allocate(f"c{i}", "eth0")  # .48-.59: .60/30 is free
        shortage = a.shortage()
        assert shortage.reason == "fragmented" and shortage.free_addresses == 4
        assert shortage.largest_free == Net("10.30.0.60/30")
        assert shortage.message == (
            "pool 10.30.0.0/26 has 4 free addresses but no free aligned /28 "
            "(the largest free aligned block is 10.30.0.60/30)"
        )
        for i in range(12, 16):
            c.allocate(f"c{i}", "eth0")
        assert c.shortage().reason == "exhausted"
    finally:
        for node in nodes:
            node.close()


def test_the_local_store_learns_the_free_column_in_place(tmp_path: Path) -> None:
    """Claims databases written before ``free`` existed are upgraded on open."""
    import sqlite3

    from ipam.claims import CLAIMS_SCHEMA

    path = tmp_path / "claims" / "10.30.0.0_24-28.db"
    path.parent.mkdir()
    with sqlite3.connect(path) as db:
        db.execute(CLAIMS_SCHEMA)
        db.execute("INSERT INTO claims VALUES ('10.30.0.0/28', 'old', 'net1', 1.0, 4)")
    store = LocalClaimStore(str(tmp_path / "claims"), Net("10.30.0.0/24"), 28)
    try:
        (claim,) = store.claims()
        assert claim.used == 4 and claim.free is None and claim.held
    finally:
        store.close()
