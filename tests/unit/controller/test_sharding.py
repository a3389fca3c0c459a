"""Stable placement: which changes rewrite which shards."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cni.controller.publisher import Publisher
from cni.controller.sharding import fits, placement_hash, shard_count
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
from cni.policy.published.names import ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS
from tests.unit.controller.published_api import PublishedStore, publish


def test_placement_is_the_same_in_every_process() -> None:
    # A fixed value: a change of the hash moves every pod, a restart must not.
    assert placement_hash("shop/web-0") == 0xD01209CE02C2F081


def test_count_grows_when_a_shard_overflows_and_shrinks_only_far_below() -> None:
    hashes = [placement_hash(f"ns/p{i}") for i in range(100)]
    count = shard_count(hashes, capacity=20)
    assert count & (count - 1) == 0 and fits(hashes, count, 20)
    assert not fits(hashes, count // 2, 20) or count == 1
    # Kept while it fits and the set is above a quarter of what the shards hold.
    assert shard_count(hashes[:60], 20, count) == count
    # Far below: smaller.
    assert shard_count(hashes[:5], 20, count) == 1
    with pytest.raises(ValueError, match="capacity 0"):
        shard_count(hashes, 0)


def cluster(pods: int) -> tuple[Publisher, PublishedStore, list[Pod]]:
    """One policy reading one group of ``pods`` pods (shards of 4), spread over two nodes."""
    publisher = Publisher(capacity=4, targets_capacity=8)
    store = PublishedStore()
    publisher.put_namespace(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    members = [
        Pod("x", f"p{i}", labels_of({"role": "peer"}), (f"10.0.0.{i + 1}",), f"n{i % 2}")
        for i in range(pods)
    ]
    for pod in members:
        publisher.put_pod(pod)
    publisher.put_pod(Pod("x", "target", labels_of({"role": "target"}), ("10.0.1.1",), "n0"))
    rule = PolicyRule((Peer(pod_selector=LabelSelector(labels_of({"role": "peer"}))),))
    publisher.put_policy(
        NetworkPolicy("x", "allow", LabelSelector(labels_of({"role": "target"})), (), (rule,)),
        "uid-1",
        1,
    )
    publish(publisher, store)
    return publisher, store, members


def writes_of(publisher: Publisher, store: PublishedStore) -> list[tuple[str, str]]:
    before = len(store.writes)
    publish(publisher, store)
    return [(verb, key[0]) for verb, key in store.writes[before:]]


def test_a_peer_joining_changing_or_leaving_rewrites_the_one_shard_that_holds_it() -> None:
    publisher, store, members = cluster(40)
    shards = [k for k in store.objects if k[0] == ADDRESS_SET]
    assert len(shards) > 4
    publisher.put_pod(Pod("x", "new", labels_of({"role": "peer"}), ("10.0.2.1",), "n1"))
    assert writes_of(publisher, store) == [
        ("replace", ADDRESS_SET),
        ("replace", POLICY_TARGETS),  # n1's pods: the new one is listed (selected by none)
    ]
    publisher.put_pod(replace(members[3], ips=("10.0.3.3",)))
    assert writes_of(publisher, store) == [("replace", ADDRESS_SET)]
    publisher.put_pod(replace(members[5], labels=labels_of({"role": "other"})))
    assert writes_of(publisher, store) == [("replace", ADDRESS_SET)]
    publisher.remove_pod(members[7].key)
    assert writes_of(publisher, store) == [("replace", ADDRESS_SET), ("replace", POLICY_TARGETS)]
    # A label no selector reads writes nothing.
    publisher.put_pod(replace(members[9], labels=labels_of({"role": "peer", "x": "y"})))
    assert writes_of(publisher, store) == []


def test_node_labels_change_only_with_a_policys_first_or_last_target_on_a_node() -> None:
    publisher, store, _ = cluster(12)
    shards = len([k for k in store.objects if k[0] == ADDRESS_SET])
    # A second target on n0: only n0's PolicyTargets.
    second = Pod("x", "target-2", labels_of({"role": "target"}), ("10.0.1.2",), "n0")
    publisher.put_pod(second)
    assert writes_of(publisher, store) == [("replace", POLICY_TARGETS)]
    # A first target on n1: the policy and every shard of its set get n1's label.
    third = Pod("x", "target-3", labels_of({"role": "target"}), ("10.0.1.3",), "n1")
    publisher.put_pod(third)
    assert sorted(writes_of(publisher, store)) == sorted(
        [("relabel", ADDRESS_SET)] * shards
        + [("relabel", POLICY_ENDPOINTS), ("replace", POLICY_TARGETS)]
    )
    # Its last target on n1 goes: the label goes.
    publisher.remove_pod(third.key)
    assert sorted(writes_of(publisher, store)) == sorted(
        [("relabel", ADDRESS_SET)] * shards
        + [("relabel", POLICY_ENDPOINTS), ("replace", POLICY_TARGETS)]
    )


def test_a_set_no_policy_reads_is_deleted_after_the_policies_are_written() -> None:
    publisher, store, _ = cluster(12)
    publisher.put_policy(
        NetworkPolicy("x", "allow", LabelSelector(labels_of({"role": "target"})), ("Ingress",)),
        "uid-1",
        2,
    )
    done = writes_of(publisher, store)
    assert done[0] == ("replace", POLICY_ENDPOINTS)
    assert set(done[1:]) == {("delete", ADDRESS_SET)}
    assert not [k for k in store.objects if k[0] == ADDRESS_SET]
