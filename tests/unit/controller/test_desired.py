"""The cluster's objects in; the sets, targets and changes they imply out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cni.controller.desired import DesiredState, PolicyRecord
from cni.controller.sharding import placement_hash
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
from cni.policy.published.names import address_set_id, pod_name
from cni.policy.published.sets import address_sets

PEERS = LabelSelector(labels_of({"role": "peer"}))
TARGETS = LabelSelector(labels_of({"role": "target"}))
FROM_PEERS = NetworkPolicy("x", "allow", TARGETS, (), (PolicyRule((Peer(pod_selector=PEERS),)),))
FROM_TEAM = NetworkPolicy(
    "x",
    "team",
    TARGETS,
    (),
    (PolicyRule((Peer(namespace_selector=LabelSelector(labels_of({"team": "a"}))),)),),
)
PEER = Pod("x", "peer", labels_of({"role": "peer"}), ("10.0.0.1",), "n0", uid="u1")
TARGET = Pod("x", "t", labels_of({"role": "target"}), ("10.0.1.1",), "n0", uid="u2")


def cluster() -> DesiredState:
    desired = DesiredState()
    desired.put_namespace(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    desired.put_pod(PEER)
    desired.put_pod(TARGET)
    desired.put_policy(FROM_PEERS, "uid-1", 1)
    desired.changes.take()
    return desired


def test_a_policy_makes_its_sets_and_lists_its_targets_with_their_nodes() -> None:
    desired = cluster()
    (key,) = address_sets(FROM_PEERS)
    state = desired.sets.get(key)
    assert state is not None and state.users == {FROM_PEERS.key}
    assert dict(state.nodes) == {"n0": 1}  # where the policy selects a pod
    assert [pod.key for pod in desired.set_members(key)] == [PEER.key]
    assert desired.targets.selection(TARGET.key).policies == ("allow",)
    assert desired.targets.selection(PEER.key).policies == ()
    assert desired.targets.nodes_of(FROM_PEERS.key) == ["n0"]
    assert desired.record(FROM_PEERS.key) == PolicyRecord(FROM_PEERS, "uid-1", 1)
    assert desired.policies() == {FROM_PEERS.key}
    assert desired.totals() == {"pods": 2, "policies": 1, "addressSets": 1, "nodes": 1}


def test_a_peer_joining_marks_the_one_pod_in_its_sets() -> None:
    desired = cluster()
    (key,) = address_sets(FROM_PEERS)
    joining = Pod("x", "peer-2", labels_of({"role": "peer"}), ("10.0.0.2",), "n1", uid="u3")
    desired.put_pod(joining)
    changes = desired.changes.take()
    assert changes.sets == {key: {joining.key}}
    assert changes.nodes == {"n1"} and changes.policies == set()
    # A pod without an address is in the group, not in the set.
    desired.put_pod(Pod("x", "peer-3", labels_of({"role": "peer"}), (), "n1"))
    assert sorted(pod.name for pod in desired.set_members(key)) == ["peer", "peer-2"]


def test_the_same_policy_again_changes_nothing_and_a_new_generation_rewrites_it() -> None:
    desired = cluster()
    desired.put_policy(FROM_PEERS, "uid-1", 1)
    assert not desired.changes
    desired.put_policy(FROM_PEERS, "uid-1", 2)
    assert desired.changes.take().policies == {FROM_PEERS.key}
    assert desired.record(FROM_PEERS.key) == PolicyRecord(FROM_PEERS, "uid-1", 2)


def test_a_policy_removed_retires_its_sets_and_retargets_its_pods() -> None:
    desired = cluster()
    (key,) = address_sets(FROM_PEERS)
    set_id = address_set_id(key)
    desired.remove_policy(FROM_PEERS.key)
    changes = desired.changes.take()
    assert changes.retired == {key: set_id} and changes.policies == {FROM_PEERS.key}
    assert changes.nodes == {"n0"}
    assert desired.targets.selection(TARGET.key).policies == ()
    assert desired.record(FROM_PEERS.key) is None and desired.sets.get(key) is None
    desired.remove_policy(FROM_PEERS.key)  # gone already: nothing
    assert not desired.changes


def test_a_first_target_on_a_node_labels_the_policys_sets_for_it() -> None:
    desired = cluster()
    (key,) = address_sets(FROM_PEERS)
    desired.put_pod(replace(TARGET, name="t2", node_name="n1", uid="u4"))
    changes = desired.changes.take()
    assert changes.policies == {FROM_PEERS.key} and changes.sets == {key: None}
    state = desired.sets.get(key)
    assert state is not None and sorted(state.nodes) == ["n0", "n1"]


def test_pods_on_the_host_network_or_on_no_node_are_in_no_targets() -> None:
    desired = cluster()
    desired.put_pod(replace(TARGET, name="host", host_network=True))
    desired.put_pod(replace(TARGET, name="pending", node_name=""))
    assert desired.targets.pods_on("n0") == [PEER.key, TARGET.key]
    assert not desired.changes.nodes


def test_a_namespace_starting_to_match_marks_every_shard_of_its_sets() -> None:
    desired = cluster()
    desired.put_policy(FROM_TEAM, "uid-2", 1)
    (key,) = address_sets(FROM_TEAM)
    desired.changes.take()
    desired.put_namespace(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x", "team": "a"})))
    assert desired.changes.take().sets == {key: None}
    assert {pod.key for pod in desired.set_members(key)} == {PEER.key, TARGET.key}
    desired.remove_namespace("x")
    assert desired.changes.take().sets == {key: None}


def test_objects_come_by_kind_and_a_relist_removes_what_it_lacks() -> None:
    desired = DesiredState()
    kinds = desired.handlers()
    kinds[Namespace].upsert(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    kinds[Pod].upsert(PEER)
    kinds[Pod].upsert(TARGET)
    kinds[PolicyRecord].upsert(PolicyRecord(FROM_PEERS, "uid-1", 1))
    assert desired.targets.selection(TARGET.key).policies == ("allow",)
    replace_pods = kinds[Pod].replace
    replace_policies = kinds[PolicyRecord].replace
    assert replace_pods is not None and replace_policies is not None
    replace_pods([PEER])
    assert desired.totals()["pods"] == 1 and desired.targets.pods_on("n0") == [PEER.key]
    replace_policies([PolicyRecord(FROM_TEAM, "uid-2", 1)])
    assert desired.policies() == {FROM_TEAM.key}
    kinds[PolicyRecord].delete(PolicyRecord(FROM_TEAM, "uid-2", 1))
    kinds[Pod].delete(PEER)
    assert desired.totals() == {"pods": 0, "policies": 0, "addressSets": 0, "nodes": 0}


def test_a_pods_placement_is_the_hash_of_its_name() -> None:
    desired = cluster()
    assert desired.placement(PEER.key) == placement_hash(pod_name(PEER.key))
    assert desired.placement(PEER.key) == desired.placement(PEER.key)


@pytest.mark.parametrize("gone", ["pod", "policy"])
def test_removing_what_is_not_there_is_harmless(gone: str) -> None:
    desired = cluster()
    if gone == "pod":
        desired.remove_pod(("x", "nobody"))
    else:
        desired.remove_policy(("x", "nothing"))
    assert not desired.changes
