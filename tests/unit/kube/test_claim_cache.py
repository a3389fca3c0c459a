"""The claim cache's rules: fed the events a watch can deliver in an order a real server
cannot be made to produce on demand (an event older than the store's own write), and
the claims that are no block of the pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni.kube import prefixclaims
from cni.kube.claimcache import ClaimCache
from ipam.errors import ClaimsUnavailable
from tests.unit.kube.claim_fakes import POOL, Net, claim_obj, config

KIND = "prefixclaims"


@pytest.fixture
def cache(tmp_path: Path) -> ClaimCache:
    made = ClaimCache(config(tmp_path))
    made.replace(KIND, [])
    return made


def blocks(cache: ClaimCache) -> dict[str, tuple[str, bool]]:
    return {str(c.block): (c.node, c.held) for c in cache.claims()}


def test_the_cache_never_goes_back_to_an_older_spec(cache: ClaimCache) -> None:
    released = "2026-12-01T10:00:00Z"
    cache.put(claim_obj("10.40.0.16/28", generation=2, released=released))  # the store's write
    cache.change(KIND, "MODIFIED", claim_obj("10.40.0.16/28", generation=1))  # the watch, late
    assert blocks(cache) == {"10.40.0.16/28": ("node-a", False)}
    cache.change(KIND, "MODIFIED", claim_obj("10.40.0.16/28", generation=2, released=released))
    cache.change(KIND, "MODIFIED", claim_obj("10.40.0.16/28", generation=3))  # taken back
    assert blocks(cache) == {"10.40.0.16/28": ("node-a", True)}


def test_a_deleted_object_never_comes_back(cache: ClaimCache) -> None:
    lost: list[bool] = []
    cache.on_lost = lambda: lost.append(True)
    cache.put(claim_obj("10.40.0.16/28", uid="old"))
    cache.forget("10.40.0.16-28", "old")  # the store deleted it
    cache.change(KIND, "MODIFIED", claim_obj("10.40.0.16/28", uid="old"))  # a late event
    assert blocks(cache) == {}
    cache.change(KIND, "ADDED", claim_obj("10.40.0.16/28", node="node-b", uid="new"))
    cache.change(KIND, "DELETED", claim_obj("10.40.0.16/28", uid="old"))  # its late DELETED
    assert blocks(cache) == {"10.40.0.16/28": ("node-b", True)}
    assert lost == []
    cache.change(KIND, "ADDED", claim_obj("10.40.0.32/28", uid="mine"))
    cache.change(KIND, "DELETED", claim_obj("10.40.0.32/28", uid="mine"))  # the Node's GC
    assert lost == [True]


def test_a_list_replaces_the_cache_but_never_revives_a_deleted_uid(cache: ClaimCache) -> None:
    cache.put(claim_obj("10.40.0.0/28", uid="a"))
    cache.put(claim_obj("10.40.0.16/28", uid="gone"))
    cache.forget("10.40.0.16-28", "gone")
    listed = [claim_obj("10.40.0.16/28", uid="gone"), claim_obj("10.40.0.32/28", uid="b")]
    cache.replace(KIND, listed)  # a list that raced with the deletion
    assert blocks(cache) == {"10.40.0.32/28": ("node-a", True)}


def test_what_this_store_deletes_is_not_lost(cache: ClaimCache) -> None:
    lost: list[bool] = []
    cache.on_lost = lambda: lost.append(True)
    cache.put(claim_obj("10.40.0.16/28", uid="mine"))
    with cache.deleting("mine"):
        cache.change(KIND, "DELETED", claim_obj("10.40.0.16/28", uid="mine"))
    assert blocks(cache) == {} and lost == []


def test_this_nodes_released_and_expired_claims(tmp_path: Path) -> None:
    cache = ClaimCache(config(tmp_path, cooldown=30))
    cache.put(claim_obj("10.40.0.32/28", uid="a", released="2026-12-01T10:00:00Z"))
    cache.put(claim_obj("10.40.0.16/28", uid="b", released="2026-12-01T10:00:20Z"))
    cache.put(claim_obj("10.40.0.48/28", uid="c", node="node-b", released="2026-12-01T10:00:00Z"))
    cache.put(claim_obj("10.40.0.0/28", uid="d"))
    assert [str(b) for b in cache.released_by("node-a", "net1")] == [
        "10.40.0.16/28",
        "10.40.0.32/28",
    ]
    at = prefixclaims.epoch_of("2026-12-01T10:00:35Z")
    assert [str(e.claim.block) for e in cache.expired(at)] == ["10.40.0.32/28"]


def forged(prefix: str, pool: str = str(POOL), node: str = "node-a") -> dict[str, Any]:
    """A claim object of ``prefix`` stating ``pool``, as only an administrator's
    credential can write it past the admission policy."""
    obj = claim_obj("10.40.0.0/28", node=node, uid=f"forged-{prefix}")
    obj["metadata"]["name"] = prefixclaims.name_of(Net(prefix))
    obj["spec"]["prefix"], obj["spec"]["pool"] = prefix, pool
    return obj


def test_claims_of_other_pools_that_leave_this_one_alone_are_none_of_its_business(
    cache: ClaimCache,
) -> None:
    cache.change(KIND, "ADDED", forged("10.41.0.0/28", "10.41.0.0/24"))
    assert blocks(cache) == {} and cache.refused == {}


@pytest.mark.parametrize(
    ("prefix", "pool", "why"),
    [
        ("10.40.0.0/23", str(POOL), "10.40.0.0/23 is outside pool 10.40.0.0/24"),
        ("10.40.0.0/24", str(POOL), "10.40.0.0/24 is a /24, not a /28 block"),
        ("10.40.0.64/29", str(POOL), "10.40.0.64/29 is a /29, not a /28 block"),
        ("169.254.169.254/32", str(POOL), "169.254.169.254/32 is outside pool 10.40.0.0/24"),
        ("10.40.0.0/23", "10.40.0.0/23", "it states pool 10.40.0.0/23, not 10.40.0.0/24"),
        ("10.40.0.16/28", "10.0.0.0/8", "it states pool 10.0.0.0/8, not 10.40.0.0/24"),
        ("10.40.0.16/28", "10.40.0.1/24", "it states no IPv4 pool, not 10.40.0.0/24"),
    ],
)
def test_a_claim_that_is_no_block_of_the_pool_is_neither_adopted_nor_taken(
    cache: ClaimCache, prefix: str, pool: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache.change(KIND, "ADDED", claim_obj("10.40.0.32/28", node="node-b", uid="b"))
    cache.change(KIND, "ADDED", forged(prefix, pool))
    cache.change(KIND, "MODIFIED", forged(prefix, pool))  # reported once
    name = prefixclaims.name_of(Net(prefix))
    assert blocks(cache) == {"10.40.0.32/28": ("node-b", True)}  # not this node's block
    assert cache.refused == {name: why}
    assert [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()] == [
        f"refusing PrefixClaim {name} of node node-a: {why} (neither adopted nor taken "
        "from the pool)"
    ]
    free = [str(b) for b in cache.free_blocks(3)]
    if Net(prefix).prefixlen == 28 and Net(prefix).subnet_of(POOL):
        assert free == ["10.40.0.0/28", "10.40.0.48/28", "10.40.0.64/28"]  # its name is taken
    else:
        assert free == ["10.40.0.0/28", "10.40.0.16/28", "10.40.0.48/28"]
    cache.change(KIND, "DELETED", forged(prefix, pool))
    assert cache.refused == {}


def test_a_list_keeps_only_the_refusals_of_objects_still_there(cache: ClaimCache) -> None:
    cache.change(KIND, "ADDED", forged("10.40.0.64/29"))
    cache.change(KIND, "ADDED", forged("10.40.0.0/23"))
    cache.replace(KIND, [forged("10.40.0.64/29")])
    assert list(cache.refused) == ["10.40.0.64-29"]


def test_an_unreadable_object_is_ignored(cache: ClaimCache) -> None:
    unreadable = claim_obj("10.40.0.16/28")
    unreadable["spec"]["prefix"] = "10.40.0.16/33"
    cache.change(KIND, "ADDED", unreadable)
    cache.change(KIND, "ADDED", {"metadata": {"name": "x", "generation": "not a number"}})
    assert blocks(cache) == {} and cache.refused == {}


def test_free_blocks_are_the_lowest_unclaimed(cache: ClaimCache) -> None:
    cache.change(KIND, "ADDED", claim_obj("10.40.0.0/28", uid="a"))
    cache.change(KIND, "ADDED", claim_obj("10.40.0.32/28", uid="b"))
    assert [str(b) for b in cache.free_blocks(3)] == [
        "10.40.0.16/28",
        "10.40.0.48/28",
        "10.40.0.64/28",
    ]


def test_an_unlisted_cache_says_so(tmp_path: Path) -> None:
    unsynced = ClaimCache(config(tmp_path))
    with pytest.raises(ClaimsUnavailable) as err:
        unsynced.claims()
    assert "has not listed the prefix claims" in str(err.value)
    unsynced.replace(KIND, [claim_obj("10.40.0.0/28")])
    assert unsynced.synced.is_set() and len(unsynced.claims()) == 1
