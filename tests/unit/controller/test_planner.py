"""Plans: the writes and deletions that bring what is published to what the cluster's
objects imply, and nothing more."""

from __future__ import annotations

import copy
from typing import Any

from cni.controller.desired import DesiredState
from cni.controller.ledger import Ledger
from cni.controller.planner import Plan, Planner
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyRule,
    labels_of,
)
from cni.policy.published.identity import shard_info
from cni.policy.published.names import (
    ADDRESS_SET,
    MANAGED_BY,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    address_set_id,
    address_set_name,
    policy_endpoints_name,
)
from cni.policy.published.render import policy_endpoints_object, policy_targets_object
from cni.policy.published.sets import address_sets
from tests.unit.controller.published_api import PublishedStore

PEERS = LabelSelector(labels_of({"role": "peer"}))
TARGETS = LabelSelector(labels_of({"role": "target"}))
ALLOW = NetworkPolicy("x", "allow", TARGETS, (), (PolicyRule((Peer(pod_selector=PEERS),)),))
TARGET = Pod("x", "t", labels_of({"role": "target"}), ("10.0.1.1",), "n0", uid="u0")


def peer(i: int, node: str = "n1") -> Pod:
    return Pod("x", f"peer-{i}", labels_of({"role": "peer"}), (f"10.0.0.{i + 1}",), node)


def planner(peers: int = 1, capacity: int = 200) -> Planner:
    desired = DesiredState()
    desired.put_namespace(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    for i in range(peers):
        desired.put_pod(peer(i))
    desired.put_pod(TARGET)
    desired.put_policy(ALLOW, "uid-1", 1)
    return Planner(desired, Ledger(), capacity=capacity)


def published(peers: int = 1, capacity: int = 200) -> tuple[Planner, PublishedStore]:
    """A planner whose first plan the API holds (the ledger told, nothing else)."""
    plans = planner(peers, capacity)
    store = PublishedStore()
    store.apply(plans.plan(), plans.ledger)
    return plans, store


def kinds_of(plan: Plan) -> list[tuple[str, str]]:
    return [(write.verb, write.kind) for write in plan.writes]


def changed_behind_its_back(store: PublishedStore, kind: str) -> dict[str, Any]:
    """One object of ``kind``, as the API would show it after someone else's edit."""
    (body,) = [copy.deepcopy(b) for (k, _), b in store.objects.items() if k == kind]
    body["metadata"]["resourceVersion"] = "999"
    return body


def test_a_first_plan_writes_sets_then_policies_then_targets() -> None:
    plan = planner().plan()
    assert kinds_of(plan) == [
        ("create", ADDRESS_SET),
        ("create", POLICY_ENDPOINTS),
        ("create", POLICY_TARGETS),  # n0
        ("create", POLICY_TARGETS),  # n1
    ]
    assert plan.deletions == []


def test_what_is_published_as_it_should_be_is_not_written_again() -> None:
    plans, _ = published()
    assert not plans.pending() and not plans.plan()
    plans.recompute_everything()
    assert plans.pending() and not plans.plan()


def test_an_object_edited_behind_its_back_is_replaced_from_its_version() -> None:
    plans, store = published()
    body = changed_behind_its_back(store, POLICY_ENDPOINTS)
    body["spec"]["addressSets"] = []
    info = shard_info(body)
    plans.ledger.observe(info)
    plans.recheck(info)
    (write,) = plans.plan().writes
    assert (write.verb, write.kind, write.resource_version) == ("replace", POLICY_ENDPOINTS, "999")
    assert write.body["metadata"]["resourceVersion"] == "999"
    assert write.body["spec"]["addressSets"] == [address_set_id(address_sets(ALLOW)[0])]


def test_labels_edited_behind_its_back_are_patched_back() -> None:
    plans, store = published()
    body = changed_behind_its_back(store, ADDRESS_SET)
    labels = body["metadata"]["labels"]
    del labels["app.kubernetes.io/managed-by"]
    labels["stray"] = "yes"
    info = shard_info(body)
    plans.ledger.observe(info)
    plans.recheck(info)
    (write,) = plans.plan().writes
    assert (write.verb, write.resource_version) == ("relabel", "999")
    assert write.labels_patch == {**MANAGED_BY, "stray": None}


def test_a_recheck_of_what_is_as_it_should_be_writes_nothing() -> None:
    plans, store = published()
    for kind in (ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS):
        for (k, _), body in store.objects.items():
            if k == kind:
                plans.recheck(shard_info(body))
    assert plans.pending() and not plans.plan()


def test_a_failed_write_or_deletion_is_planned_again() -> None:
    plans = planner()
    first = plans.plan()
    for write in first.writes:
        plans.replan(write)
    again = plans.plan()
    assert [(w.verb, w.key) for w in again.writes] == [(w.verb, w.key) for w in first.writes]
    # A failed deletion of a set nobody reads: the sweep finds it again.
    plans, store = published()
    (info,) = [shard_info(b) for (k, _), b in store.objects.items() if k == ADDRESS_SET]
    plans.desired.remove_policy(ALLOW.key)
    plans.plan()  # its deletion fails
    plans.replan(info)
    assert info in plans.plan().deletions


def test_a_set_no_policy_reads_is_deleted_after_the_writes() -> None:
    plans, store = published()
    set_shards = {key for key in store.objects if key[0] == ADDRESS_SET}
    plans.desired.remove_policy(ALLOW.key)
    plan = plans.plan()
    assert kinds_of(plan) == [("replace", POLICY_TARGETS)]  # n0's target, selected by none
    assert {info.object_key for info in plan.deletions} == set_shards | {
        (POLICY_ENDPOINTS, policy_endpoints_name("x", "allow"))
    }


def test_only_a_sweep_deletes_what_belongs_to_nothing() -> None:
    plans, _ = published()
    gone = NetworkPolicy("x", "gone")
    orphans = [
        policy_endpoints_object(gone, "uid-9", 1, [], []),
        policy_targets_object("n9", 0, 1, []),
    ]
    for body in orphans:
        plans.ledger.observe(shard_info(body))
    assert not plans.plan().deletions
    plans.recompute_everything()
    plan = plans.plan()
    assert sorted(info.name for info in plan.deletions) == sorted(
        body["metadata"]["name"] for body in orphans
    )
    assert [w.name for w in plan.writes] == []  # the known objects are as they should be


def test_a_foreign_object_is_deleted_by_every_plan_until_it_is_gone() -> None:
    plans, store = published()
    (body,) = [copy.deepcopy(b) for (k, _), b in store.objects.items() if k == ADDRESS_SET]
    body["metadata"]["name"] = "evil"
    forged = shard_info(body)
    assert not plans.ledger.observe(forged)
    assert plans.pending()
    assert plans.plan().deletions == [forged]
    assert plans.plan().deletions == [forged]
    plans.ledger.forget(forged)
    assert not plans.pending() and not plans.plan()


def test_a_set_is_cut_into_shards_by_capacity_and_shrinks_far_below_it() -> None:
    plans, store = published(peers=6, capacity=2)
    (key,) = address_sets(ALLOW)
    state = plans.desired.sets.get(key)
    assert state is not None and state.shards >= 4
    shards = [b for (k, _), b in store.objects.items() if k == ADDRESS_SET]
    assert len(shards) == state.shards
    assert {b["spec"]["shardCount"] for b in shards} == {state.shards}
    assert sum(len(b["spec"]["pods"]) for b in shards) == 6
    # A peer joining rewrites the one shard that holds it (a set's node labels follow
    # its readers' targets, not its members).
    plans.desired.put_pod(peer(6, node="n2"))
    plan = plans.plan()
    assert [w.kind for w in plan.writes].count(ADDRESS_SET) == 1
    store.apply(plan, plans.ledger)
    for i in range(1, 7):
        plans.desired.remove_pod(peer(i).key)
    plan = plans.plan()
    assert state.shards == 1
    assert [(w.verb, w.name) for w in plan.writes if w.kind == ADDRESS_SET] == [
        ("replace", address_set_name(state.id, 0))
    ]
    assert sorted(info.index for info in plan.deletions if info.kind == ADDRESS_SET) == list(
        range(1, len(shards))
    )


def test_a_deletion_found_twice_is_planned_once() -> None:
    plans, _ = published()
    plans.desired.remove_policy(ALLOW.key)
    plans.recompute_everything()  # the sweep finds the retired set too
    deletions = plans.plan().deletions
    assert len(deletions) == len({info.object_key for info in deletions}) == 2
