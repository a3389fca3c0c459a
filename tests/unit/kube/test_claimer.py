"""Claiming, giving back and deleting blocks against an API server in memory (the
requests against a real one: tests/node/kube/test_prefix_claims_api.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cni.kube import claimer as claimer_module
from cni.kube import prefixclaims
from cni.kube.api import ApiError
from cni.kube.claimcache import ClaimCache
from cni.kube.claimer import Claimer
from ipam.errors import ClaimsUnavailable, StoreError
from tests.unit.kube.claim_fakes import POOL, FakeApi, Net, claim_obj, config

START = prefixclaims.epoch_of("2026-12-01T10:00:00Z")


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def claimer(tmp_path: Path, api: FakeApi, cooldown: float = 30) -> tuple[Claimer, Clock]:
    cache = ClaimCache(config(tmp_path, cooldown=cooldown))
    cache.replace("prefixclaims", list(api.claims.values()))
    clock = Clock()
    return Claimer(api, cache.config, cache, clock), clock  # type: ignore[arg-type]


def held(made: Claimer) -> dict[str, tuple[str, bool]]:
    return {str(c.block): (c.node, c.held) for c in made.cache.claims()}


def test_a_claim_creates_the_lowest_free_block_owned_by_the_node(tmp_path: Path) -> None:
    api = FakeApi()
    api.add(claim_obj("10.40.0.0/28", node="node-b"))
    made, _ = claimer(tmp_path, api)
    assert made.claim("node-a", "net1") == Net("10.40.0.16/28")
    obj = api.claims["10.40.0.16-28"]
    assert prefixclaims.owner_uid(obj) == "node-uid"
    assert held(made) == {"10.40.0.0/28": ("node-b", True), "10.40.0.16/28": ("node-a", True)}
    assert made.conflicts == 0


def test_a_lost_create_reads_the_winner_and_moves_on(tmp_path: Path) -> None:
    api = FakeApi()
    made, _ = claimer(tmp_path, api)
    api.add(claim_obj("10.40.0.0/28", node="node-b"))  # the cache does not know yet
    block = made.claim("node-a", "net1")
    assert block is not None and block != Net("10.40.0.0/28")
    assert held(made)["10.40.0.0/28"] == ("node-b", True)
    assert made.conflicts == 1


def test_conflicts_in_a_row_end_the_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimer_module, "MAX_CONFLICTS", 3)
    api = FakeApi()
    made, _ = claimer(tmp_path, api)
    for block in Net(str(POOL)).subnets(new_prefix=28):
        api.add(claim_obj(str(block), node="node-b"))
    with pytest.raises(StoreError, match="after 3 conflicts in a row"):
        made.claim("node-a", "net1")


def test_a_full_pool_has_no_block(tmp_path: Path) -> None:
    api = FakeApi()
    for block in Net(str(POOL)).subnets(new_prefix=28):
        api.add(claim_obj(str(block), node="node-b"))
    made, _ = claimer(tmp_path, api)
    assert made.claim("node-a", "net1") is None


def test_a_block_given_back_is_taken_back_first(tmp_path: Path) -> None:
    api = FakeApi()
    made, clock = claimer(tmp_path, api)
    assert made.claim("node-a", "net1") == Net("10.40.0.0/28")
    assert made.claim("node-a", "net1") == Net("10.40.0.16/28")
    made.release(Net("10.40.0.16/28"), "node-a")
    assert api.claims["10.40.0.16-28"]["spec"]["releasedAt"] == prefixclaims.rfc3339(START)
    assert held(made)["10.40.0.16/28"] == ("node-a", False)
    clock.now += 10
    assert made.claim("node-a", "net1") == Net("10.40.0.16/28")
    assert "releasedAt" not in api.claims["10.40.0.16-28"]["spec"]
    assert held(made)["10.40.0.16/28"] == ("node-a", True)


def test_claim_block_takes_back_this_nodes_block_but_not_anothers(tmp_path: Path) -> None:
    api = FakeApi()
    api.add(claim_obj("10.40.0.32/28", node="node-b"))
    api.add(claim_obj("10.40.0.16/28", released="2026-12-01T09:59:00Z"))
    made, _ = claimer(tmp_path, api)
    assert made.claim_block(Net("10.40.0.16/28"), "node-a", "net1")
    assert held(made)["10.40.0.16/28"] == ("node-a", True)
    assert not made.claim_block(Net("10.40.0.32/28"), "node-a", "net1")
    assert made.claim_block(Net("10.40.0.48/28"), "node-a", "net1")  # created
    for block in ("10.40.0.0/24", "10.40.0.0/29", "10.41.0.0/28"):
        with pytest.raises(StoreError, match=f"not claiming {block}"):
            made.claim_block(Net(block), "node-a", "net1")


def test_without_a_cooldown_a_block_given_back_is_deleted(tmp_path: Path) -> None:
    api = FakeApi()
    made, _ = claimer(tmp_path, api, cooldown=0)
    block = made.claim("node-a", "net1")
    assert block is not None
    made.release(block, "node-b")  # not its holder: nothing happens
    assert list(api.claims) == ["10.40.0.0-28"]
    made.release(block, "node-a")
    assert api.claims == {} and held(made) == {}


def test_a_block_deleted_meanwhile_is_forgotten_on_release(tmp_path: Path) -> None:
    api = FakeApi()
    made, _ = claimer(tmp_path, api)
    block = made.claim("node-a", "net1")
    assert block is not None
    api.claims.clear()  # an operator
    made.release(block, "node-a")
    assert held(made) == {}


def test_the_sweep_deletes_expired_claims_unless_taken_back_meanwhile(tmp_path: Path) -> None:
    api = FakeApi()
    made, clock = claimer(tmp_path, api)
    first, second = made.claim("node-a", "net1"), made.claim("node-a", "net1")
    assert first is not None and second is not None
    made.release(first, "node-a")
    made.release(second, "node-a")
    clock.now += 29
    assert made.sweep() == 0
    clock.now += 1
    # Taken back by another of this node's processes: the cache has the old version.
    api.patch(prefixclaims.path_of(second), {"spec": {"releasedAt": None}})
    assert made.sweep() == 1
    assert list(api.claims) == [prefixclaims.name_of(second)]
    assert held(made) == {str(second): ("node-a", True)}  # read back after the 409


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (ApiError(0, "connection refused"), ClaimsUnavailable),
        (ApiError(503, "unavailable"), ClaimsUnavailable),
        (ApiError(429, "too many requests"), ClaimsUnavailable),
        (ApiError(403, "forbidden"), StoreError),
    ],
)
def test_a_failed_request_fails_the_claim(
    tmp_path: Path, error: ApiError, raised: type[Exception]
) -> None:
    api = FakeApi()
    made, _ = claimer(tmp_path, api)
    api.fail["POST"] = error
    with pytest.raises(
        raised, match=re.escape("claiming 10.40.0.0/28 in the Kubernetes API failed")
    ):
        made.claim("node-a", "net1")


def test_claims_are_owned_by_a_registered_node(tmp_path: Path) -> None:
    api = FakeApi()
    api.nodes.clear()
    made, _ = claimer(tmp_path, api)
    with pytest.raises(ClaimsUnavailable, match="Node node-a is not registered"):
        made.claim("node-a", "net1")
    assert api.claims == {}


def test_an_unlisted_cache_claims_nothing(tmp_path: Path) -> None:
    api = FakeApi()
    made = Claimer(api, config(tmp_path), ClaimCache(config(tmp_path)))  # type: ignore[arg-type]
    with pytest.raises(ClaimsUnavailable):
        made.claim("node-a", "net1")
    assert api.requests == []
