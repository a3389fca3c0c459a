"""The PrefixClaim format, the claim cache's ordering rules, and the agent's checks of
a network whose claims live in the API.

The store's requests are tested against a real API server (tests/node/kube); here the
cache is fed the events a watch can deliver in an order a real server cannot be made
to produce on demand (an event older than the store's own write).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from cni.agent.prefix_claims import ClaimsConfigError, check_agent_config
from cni.kube import prefixclaims
from cni.kube.claimstore import ApiClaimStore
from cni.plugin import netconf
from ipam import config as ipam_config
from ipam.claims import BlockUsage
from ipam.errors import ClaimsUnavailable, StoreError

Net = ipaddress.IPv4Network
POOL = Net("10.40.0.0/24")


def config(tmp_path: Path) -> ipam_config.PrefixConfig:
    parsed = ipam_config.from_plugin(
        "net1",
        {
            "stateDir": str(tmp_path),
            "ipam": {
                "type": "sluice-ipam",
                "mode": "prefix",
                "pool": str(POOL),
                "claimStore": "kubernetes",
                "nodeName": "node-a",
            },
        },
    )
    assert isinstance(parsed, ipam_config.PrefixConfig)
    return parsed


def claim_obj(
    block: str,
    node: str = "node-a",
    uid: str = "u1",
    generation: int = 1,
    released: str | None = None,
    used: int | None = None,
) -> dict[str, Any]:
    obj = prefixclaims.claim_object(Net(block), POOL, node, "node-uid", "net1")
    obj["metadata"].update(
        uid=uid,
        generation=generation,
        resourceVersion=str(generation),
        creationTimestamp="2026-12-01T10:00:00Z",
    )
    if released:
        obj["spec"]["releasedAt"] = released
    if used is not None:
        obj.update(prefixclaims.usage_status(BlockUsage(used, ())))
    return obj


def test_the_object_format_round_trips() -> None:
    obj = claim_obj("10.40.0.16/28", used=3)
    assert obj["metadata"]["name"] == "10.40.0.16-28"
    assert obj["metadata"]["labels"] == {
        "sluice.dev/node": "node-a",
        "sluice.dev/pool": "10.40.0.0-24",
    }
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid"}
    ]
    assert prefixclaims.owner_uid(obj) == "node-uid"
    claim = prefixclaims.parse(obj)
    assert claim.block == Net("10.40.0.16/28") and claim.node == "node-a"
    assert claim.network == "net1" and claim.used == 3 and claim.free == ()
    assert claim.held and claim.claimed_at == 1796119200.0
    released = prefixclaims.parse(claim_obj("10.40.0.16/28", released="2026-12-01T10:00:01.5Z"))
    assert not released.held and released.released_at == 1796119201.5
    assert prefixclaims.epoch_of(prefixclaims.rfc3339(1796119201.25)) == 1796119201.25


@pytest.mark.parametrize(
    "change",
    [
        {"metadata": {"name": "10.40.0.32-28"}},
        {"spec": {"prefix": "10.40.0.16/33"}},
        {"spec": {"prefix": "10.40.0.16/28", "node": None}},
        {"spec": {"prefix": "10.40.0.16/28", "node": "n", "network": "x", "releasedAt": "x"}},
    ],
)
def test_an_object_that_states_no_claim_is_refused(change: dict[str, Any]) -> None:
    obj = claim_obj("10.40.0.16/28")
    for key, value in change.items():
        obj[key] = {**obj[key], **value}
    with pytest.raises(prefixclaims.ClaimFormatError):
        prefixclaims.parse(obj)


@pytest.fixture
def store(tmp_path: Path) -> ApiClaimStore:
    made = ApiClaimStore(None, config(tmp_path))  # type: ignore[arg-type]  # no request is made
    made.synced.set()
    return made


def blocks(store: ApiClaimStore) -> dict[str, tuple[str, bool]]:
    return {str(c.block): (c.node, c.held) for c in store.claims()}


def test_the_cache_never_goes_back_to_an_older_spec(store: ApiClaimStore) -> None:
    released = "2026-12-01T10:00:00Z"
    store._put(claim_obj("10.40.0.16/28", generation=2, released=released))  # the store's write
    store._apply("MODIFIED", claim_obj("10.40.0.16/28", generation=1))  # the watch, late
    assert blocks(store) == {"10.40.0.16/28": ("node-a", False)}
    store._apply("MODIFIED", claim_obj("10.40.0.16/28", generation=2, released=released, used=0))
    store._apply("MODIFIED", claim_obj("10.40.0.16/28", generation=3))  # taken back
    assert blocks(store) == {"10.40.0.16/28": ("node-a", True)}


def test_a_deleted_object_never_comes_back(store: ApiClaimStore) -> None:
    lost: list[bool] = []
    store.on_lost = lambda: lost.append(True)
    store._put(claim_obj("10.40.0.16/28", uid="old"))
    store._forget("10.40.0.16-28", "old")  # the store deleted it
    store._apply("MODIFIED", claim_obj("10.40.0.16/28", uid="old"))  # a late event
    assert blocks(store) == {}
    store._apply("ADDED", claim_obj("10.40.0.16/28", node="node-b", uid="new"))  # another node's
    store._apply("DELETED", claim_obj("10.40.0.16/28", uid="old"))  # its late DELETED
    assert blocks(store) == {"10.40.0.16/28": ("node-b", True)}
    assert lost == []
    store._apply("ADDED", claim_obj("10.40.0.32/28", uid="mine"))
    store._apply("DELETED", claim_obj("10.40.0.32/28", uid="mine"))  # the Node's GC
    assert lost == [True]


def forged(prefix: str, pool: str = str(POOL), node: str = "node-a") -> dict[str, Any]:
    """A claim object of ``prefix`` stating ``pool``, as only an administrator's
    credential can write it past the admission policy."""
    obj = claim_obj("10.40.0.0/28", node=node, uid=f"forged-{prefix}")
    obj["metadata"]["name"] = prefixclaims.name_of(Net(prefix))
    obj["spec"]["prefix"], obj["spec"]["pool"] = prefix, pool
    return obj


def test_claims_of_other_pools_that_leave_this_one_alone_are_none_of_its_business(
    store: ApiClaimStore,
) -> None:
    other = forged("10.41.0.0/28", "10.41.0.0/24")
    store._apply("ADDED", other)
    assert blocks(store) == {} and store.refused == {}


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
    store: ApiClaimStore, prefix: str, pool: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    store._apply("ADDED", claim_obj("10.40.0.32/28", node="node-b", uid="b"))
    store._apply("ADDED", forged(prefix, pool))
    store._apply("MODIFIED", forged(prefix, pool))  # reported once
    name = prefixclaims.name_of(Net(prefix))
    assert blocks(store) == {"10.40.0.32/28": ("node-b", True)}  # not this node's block
    assert store.refused == {name: why}
    assert [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()] == [
        f"refusing PrefixClaim {name} of node node-a: {why} (neither adopted nor taken "
        "from the pool)"
    ]
    free = [str(b) for b in store._free_blocks(3)]
    if Net(prefix).prefixlen == 28 and Net(prefix).subnet_of(POOL):
        assert free == ["10.40.0.0/28", "10.40.0.48/28", "10.40.0.64/28"]  # its name is taken
    else:
        assert free == ["10.40.0.0/28", "10.40.0.16/28", "10.40.0.48/28"]
    store._apply("DELETED", forged(prefix, pool))
    assert store.refused == {}


def test_a_block_that_is_no_block_of_the_pool_is_never_claimed(store: ApiClaimStore) -> None:
    for block in ("10.40.0.0/24", "10.40.0.0/29", "10.41.0.0/28"):
        with pytest.raises(StoreError, match=f"not claiming {block}"):
            store.claim_block(Net(block), "node-a", "net1")


def test_the_pool_a_claim_states_is_read_as_the_agents_write_it() -> None:
    assert prefixclaims.parse(claim_obj("10.40.0.16/28")).pool == POOL
    for stated in ("10.40.0.1/24", "10.40.0.0/255.255.255.0", "fd00::/64", 42, None):
        obj = claim_obj("10.40.0.16/28")
        obj["spec"]["pool"] = stated
        assert prefixclaims.parse(obj).pool is None, stated


def test_free_blocks_are_the_lowest_unclaimed(store: ApiClaimStore) -> None:
    store._apply("ADDED", claim_obj("10.40.0.0/28", uid="a"))
    store._apply("ADDED", claim_obj("10.40.0.32/28", uid="b"))
    assert [str(b) for b in store._free_blocks(3)] == [
        "10.40.0.16/28",
        "10.40.0.48/28",
        "10.40.0.64/28",
    ]


def test_an_unsynced_store_says_so(tmp_path: Path) -> None:
    unsynced = ApiClaimStore(None, config(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ClaimsUnavailable) as err:
        unsynced.claims()
    assert "has not listed the prefix claims" in str(err.value)


def test_the_agent_refuses_a_network_it_cannot_serve(tmp_path: Path) -> None:
    conf = netconf.parse(
        {
            "name": "net1",
            "type": "sluice",
            "stateDir": str(tmp_path),
            "ipam": {**config(tmp_path).to_json(), "type": "sluice-ipam"},
        }
    )
    check_agent_config(conf, "node-a", from_api=True)
    with pytest.raises(ClaimsConfigError) as err:
        check_agent_config(conf, "node-a", from_api=False)
    assert "needs --kubeconfig" in str(err.value)
    with pytest.raises(ClaimsConfigError) as err:
        check_agent_config(conf, "node-b", from_api=True)
    assert "\"ipam.nodeName\" is 'node-a'" in str(err.value)
