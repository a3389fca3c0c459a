"""The PrefixClaim format, the claim store as a whole (its pieces: test_claim_cache,
test_claimer, test_claim_usage), and the agent's checks of a network whose claims
live in the API. The store's requests against a real API server: tests/node/kube.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni.agent.prefix_claims import ClaimsConfigError, check_agent_config
from cni.kube import prefixclaims
from cni.kube.claimstore import ApiClaimStore
from cni.plugin import netconf
from ipam.claims import BlockUsage, Shortage
from ipam.errors import ClaimsUnavailable
from tests.unit.kube.claim_fakes import POOL, FakeApi, Net, claim_obj, config


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


def test_the_pool_a_claim_states_is_read_as_the_agents_write_it() -> None:
    assert prefixclaims.parse(claim_obj("10.40.0.16/28")).pool == POOL
    for stated in ("10.40.0.1/24", "10.40.0.0/255.255.255.0", "fd00::/64", 42, None):
        obj = claim_obj("10.40.0.16/28")
        obj["spec"]["pool"] = stated
        assert prefixclaims.parse(obj).pool is None, stated


def test_the_store_lists_consistently_claims_and_publishes_at_stop(tmp_path: Path) -> None:
    api = FakeApi()
    api.add(claim_obj("10.40.0.0/28", node="node-b"))
    store = ApiClaimStore(api, config(tmp_path))  # type: ignore[arg-type]
    lost: list[bool] = []
    store.on_lost = lambda: lost.append(True)
    store.start()
    try:
        assert store.synced.wait(10)
        assert api.lists == [{}]  # no resourceVersion: read from etcd
        block = store.claim("node-a", "net1")
        assert block == Net("10.40.0.16/28")
        store.report_usage("node-a", {block: BlockUsage(3, ())})
        store.no_free_block("node-a", Shortage("exhausted", "the pool is exhausted", 0, None))
    finally:
        store.stop()
        api.closed.set()
    assert api.claims[prefixclaims.name_of(block)]["status"]["used"] == 3
    assert {str(c.block): c.used for c in store.claims()} == {
        "10.40.0.0/28": 0,
        "10.40.0.16/28": 3,
    }
    assert store.shortages == {"exhausted": 1} and store.conflicts == 0 and store.refused == {}
    assert lost == []
    deleted = api.claims.pop(prefixclaims.name_of(block))  # the Node's garbage collector
    store.cache.change("prefixclaims", "DELETED", deleted)
    assert lost == [True]


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
