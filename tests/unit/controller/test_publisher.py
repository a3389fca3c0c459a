"""The publisher: one receiver for every kind, and what the API shows of the controller's
objects (or refuses) reaches the plans."""

from __future__ import annotations

import copy

import pytest

from cni.controller.desired import PolicyRecord
from cni.controller.publisher import Publisher
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
from cni.policy.published.identity import INFO_TYPES, shard_info
from cni.policy.published.names import ADDRESS_SET, POLICY_TARGETS
from tests.unit.controller.published_api import PublishedStore, publish

PEERS = LabelSelector(labels_of({"role": "peer"}))
TARGETS = LabelSelector(labels_of({"role": "target"}))
ALLOW = NetworkPolicy("x", "allow", TARGETS, (), (PolicyRule((Peer(pod_selector=PEERS),)),))


def published() -> tuple[Publisher, PublishedStore]:
    publisher = Publisher()
    store = PublishedStore()
    publisher.upsert(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    publisher.upsert(Pod("x", "peer", labels_of({"role": "peer"}), ("10.0.0.1",), "n0"))
    publisher.upsert(Pod("x", "t", labels_of({"role": "target"}), ("10.0.1.1",), "n0"))
    publisher.upsert(PolicyRecord(ALLOW, "uid-1", 1))
    publish(publisher, store)
    return publisher, store


def relist(publisher: Publisher, store: PublishedStore, kind: str) -> None:
    infos = [shard_info(body) for (k, _), body in store.objects.items() if k == kind]
    publisher.replace_all(INFO_TYPES[kind], infos)


def test_every_kind_comes_by_its_type_and_others_are_refused() -> None:
    publisher, store = published()
    assert publisher.index.policy(ALLOW.key) == ALLOW
    assert publisher.published_count() == len(store.objects) == 3
    assert not publisher.pending()
    with pytest.raises(TypeError, match="the publisher takes no dict"):
        publisher.upsert({})


def test_an_object_edited_behind_its_back_is_written_back() -> None:
    publisher, store = published()
    ((key, body),) = [
        (k, copy.deepcopy(b)) for k, b in store.objects.items() if k[0] == ADDRESS_SET
    ]
    body["spec"]["pods"] = []
    body["metadata"]["resourceVersion"] = "999"
    store.objects[key] = body
    publisher.observe(shard_info(body))
    assert publisher.pending()
    (write,) = publisher.plan().writes
    assert (write.verb, write.key, write.resource_version) == ("replace", key, "999")


def test_an_object_deleted_behind_its_back_is_created_again() -> None:
    publisher, store = published()
    (key,) = [k for k in store.objects if k[0] == POLICY_TARGETS]
    publisher.delete(shard_info(store.objects.pop(key)))
    (write,) = publisher.plan().writes
    assert (write.verb, write.key) == ("create", key)


def test_a_relist_writes_back_only_what_it_lacks() -> None:
    publisher, store = published()
    for kind in INFO_TYPES:
        relist(publisher, store, kind)
    assert not publisher.plan()
    (key,) = [k for k in store.objects if k[0] == ADDRESS_SET]
    del store.objects[key]
    relist(publisher, store, ADDRESS_SET)
    (write,) = publisher.plan().writes
    assert (write.verb, write.key) == ("create", key)


def test_a_failed_write_is_planned_again() -> None:
    publisher, _ = published()
    publisher.put_pod(Pod("x", "peer-2", labels_of({"role": "peer"}), ("10.0.0.2",), "n0"))
    first = publisher.plan()
    assert first.writes
    for write in first.writes:
        publisher.replan(write)
    again = publisher.plan()
    assert [(w.verb, w.key) for w in again.writes] == [(w.verb, w.key) for w in first.writes]


def test_a_new_term_plans_everything_and_writes_nothing_that_is_right() -> None:
    publisher, store = published()
    publisher.recompute_everything()
    assert publisher.pending()
    before = len(store.writes)
    publish(publisher, store)
    assert len(store.writes) == before
