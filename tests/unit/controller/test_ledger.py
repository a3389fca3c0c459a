"""What is published, as the API shows it: which objects changed, by set and by kind,
and which are no shard of the controller's."""

from __future__ import annotations

from dataclasses import replace

from cni.controller.ledger import Ledger
from cni.policy.published.identity import (
    AddressSetInfo,
    PolicyEndpointsInfo,
    PolicyTargetsInfo,
    ShardInfo,
)
from cni.policy.published.names import (
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    address_set_name,
    policy_endpoints_name,
    policy_targets_name,
)


def shard(index: int, count: int = 2, version: str = "1", set_id: str = "as-1") -> ShardInfo:
    name = address_set_name(set_id, index)
    return AddressSetInfo(ADDRESS_SET, name, "", set_id, (), index, count, resource_version=version)


POLICY_NAME = policy_endpoints_name("x", "p")
POLICY = PolicyEndpointsInfo(POLICY_ENDPOINTS, POLICY_NAME, "x", "p", ("uid", "1"), 0, 1)
TARGETS = PolicyTargetsInfo(POLICY_TARGETS, policy_targets_name("n0", 0), "", "n0", (), 0, 1)
FORGED = replace(shard(0), name="evil", foreign="its name is not the one its spec derives")


def test_an_object_is_new_once_and_changed_with_each_new_version() -> None:
    ledger = Ledger()
    assert ledger.observe(shard(0))
    assert not ledger.observe(shard(0))  # an echo of what is held
    assert ledger.observe(shard(0, version="2"))
    assert ledger.get(shard(0).object_key) == shard(0, version="2")
    assert ledger.count() == 1


def test_a_sets_shards_come_by_index_and_shard_0_says_the_count() -> None:
    ledger = Ledger()
    for index in (1, 0):
        ledger.observe(shard(index, count=2))
    ledger.observe(shard(0, count=4, set_id="as-2"))
    assert [info.index for info in ledger.shards(ADDRESS_SET, "", "as-1")] == [0, 1]
    assert ledger.shard_count(ADDRESS_SET, "", "as-1") == 2
    assert ledger.shard_count(ADDRESS_SET, "", "as-2") == 4
    ledger.forget(shard(0, count=2))
    assert ledger.shard_count(ADDRESS_SET, "", "as-1") == 0  # no shard 0: unknown
    assert ledger.shards(ADDRESS_SET, "", "as-3") == []


def test_forget_says_whether_the_object_was_held() -> None:
    ledger = Ledger()
    ledger.observe(shard(0))
    assert ledger.forget(shard(0))
    assert not ledger.forget(shard(0))
    assert ledger.count() == 0 and ledger.shards(ADDRESS_SET, "", "as-1") == []


def test_counts_by_kind_and_objects_of_a_kind() -> None:
    ledger = Ledger()
    for info in (shard(0), shard(1), POLICY, TARGETS):
        ledger.observe(info)
    assert ledger.count_by_kind() == {ADDRESS_SET: 2, POLICY_ENDPOINTS: 1, POLICY_TARGETS: 1}
    assert ledger.of_kind(POLICY_TARGETS) == [TARGETS]
    assert len(ledger.all()) == 4


def test_an_object_under_a_name_its_spec_does_not_derive_is_held_apart() -> None:
    ledger = Ledger()
    assert not ledger.observe(FORGED)
    assert ledger.foreign() == [FORGED] and ledger.count() == 0
    assert ledger.shards(ADDRESS_SET, "", "as-1") == []
    assert not ledger.forget(FORGED)
    assert ledger.foreign() == []


def test_a_foreign_object_under_its_derived_name_is_held_as_published() -> None:
    """It lacks a label, say: the plan writes it as it should be, never deletes it."""
    ledger = Ledger()
    unlabelled = replace(shard(0), foreign="it lacks the label app.kubernetes.io/managed-by")
    assert ledger.observe(unlabelled)
    assert ledger.foreign() == [] and ledger.count() == 1


def test_a_relist_makes_a_kind_exactly_what_was_listed_and_says_what_changed() -> None:
    ledger = Ledger()
    for info in (shard(0), shard(1), POLICY, FORGED):
        ledger.observe(info)
    changed = ledger.replace(ADDRESS_SET, [shard(1), shard(2, count=4)])
    # Held ones are forgotten first (each a change), then the listed ones observed.
    assert changed == [shard(0), shard(1), shard(1), shard(2, count=4)]
    assert {info.index for info in ledger.of_kind(ADDRESS_SET)} == {1, 2}
    assert ledger.foreign() == [] and ledger.of_kind(POLICY_ENDPOINTS) == [POLICY]
    assert ledger.replace(POLICY_TARGETS, []) == []
