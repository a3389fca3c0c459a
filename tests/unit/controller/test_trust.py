"""Only the controller's objects count: agents read an object only as the controller
writes it, and the controller deletes objects of its kinds that it would never write."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cni.controller.publisher import Publisher
from cni.policy.errors import PolicyInputError
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
from cni.policy.published.index import ShardIndex
from cni.policy.published.names import ADDRESS_SET, POLICY_ENDPOINTS
from cni.policy.published.shards import parse_address_set, parse_policy_endpoints
from tests.unit.controller.published_api import PublishedStore, publish

PEERS = LabelSelector(labels_of({"role": "peer"}))
TARGETS = LabelSelector(labels_of({"role": "target"}))


def published_cluster() -> tuple[Publisher, PublishedStore]:
    publisher = Publisher()
    store = PublishedStore()
    publisher.put_namespace(Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})))
    publisher.put_pod(Pod("x", "peer", labels_of({"role": "peer"}), ("10.0.0.1",), "n0", uid="u1"))
    publisher.put_pod(Pod("x", "t", labels_of({"role": "target"}), ("10.0.1.1",), "n0", uid="u2"))
    rule = PolicyRule((Peer(pod_selector=PEERS),))
    publisher.put_policy(NetworkPolicy("x", "allow", TARGETS, (), (rule,)), "uid-1", 1)
    publish(publisher, store)
    return publisher, store


def one(store: PublishedStore, kind: str) -> dict[str, Any]:
    (body,) = [body for (k, _), body in store.objects.items() if k == kind]
    return copy.deepcopy(body)


def test_the_controllers_objects_are_read() -> None:
    _, store = published_cluster()
    shard = parse_address_set(one(store, ADDRESS_SET))
    assert [pod.key for pod in shard.pods] == [("x", "peer")]
    policy = parse_policy_endpoints(one(store, POLICY_ENDPOINTS))
    assert policy.info.name == "x.allow" and policy.info.set_key == (POLICY_ENDPOINTS, "x", "allow")


def test_a_shard_under_another_name_is_refused_and_shadows_nothing() -> None:
    publisher, store = published_cluster()
    real = one(store, ADDRESS_SET)
    forged = copy.deepcopy(real)
    forged["metadata"]["name"] = "evil"
    forged["spec"]["pods"].append({"pod": "x/intruder", "ips": ["10.9.9.9"]})
    with pytest.raises(PolicyInputError, match=r"its name is not as-.*-0, the one its spec"):
        parse_address_set(forged)
    # The controller deletes it, and nothing else.
    publisher.observe(shard_info(forged))
    plan = publisher.plan()
    assert [d.name for d in plan.deletions] == ["evil"] and plan.writes == []


def test_an_object_without_the_managed_by_label_is_refused() -> None:
    _, store = published_cluster()
    body = one(store, ADDRESS_SET)
    del body["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    with pytest.raises(PolicyInputError, match=r"lacks the label app\.kubernetes\.io/managed-by"):
        parse_address_set(body)


def test_policy_endpoints_without_the_policy_uid_are_refused_and_rewritten() -> None:
    publisher, store = published_cluster()
    body = one(store, POLICY_ENDPOINTS)
    body["spec"]["policyUID"] = ""
    with pytest.raises(PolicyInputError, match="names no policy uid"):
        parse_policy_endpoints(body)
    body["metadata"]["resourceVersion"] = "999"
    publisher.observe(shard_info(body))
    plan = publisher.plan()
    assert [(w.name, w.verb) for w in plan.writes] == [("x.allow", "replace")]
    assert plan.writes[0].body["spec"]["policyUID"] == "uid-1"


def test_a_label_stripped_by_someone_else_is_put_back() -> None:
    publisher, store = published_cluster()
    body = one(store, ADDRESS_SET)
    del body["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    body["metadata"]["resourceVersion"] = "999"
    publisher.observe(shard_info(body))
    (write,) = publisher.plan().writes
    assert write.verb == "relabel"
    assert write.labels_patch == {"app.kubernetes.io/managed-by": "sluice-controller"}


def test_an_agent_ignores_what_the_controller_did_not_write() -> None:
    """A forged set of the same id at a new shard count never completes a set, and a
    forged copy of a real shard under another name is never read."""
    _, store = published_cluster()
    agent = ShardIndex("n0")
    agent.upsert_pod(Pod("x", "t", labels_of({"role": "target"}), ("10.0.1.1",), "n0", uid="u2"))
    store.feed(agent)
    before = agent.resolve(("x", "t")).endpoint
    real = one(store, ADDRESS_SET)
    for index in range(2):
        forged = copy.deepcopy(real)
        forged["metadata"]["name"] = f"forged-{index}"
        forged["spec"].update(shardIndex=index, shardCount=2)
        forged["spec"]["pods"] = [{"pod": "x/intruder", "ips": ["10.9.9.9"]}]
        with pytest.raises(PolicyInputError, match="is not the controller's"):
            parse_address_set(forged)
    assert agent.resolve(("x", "t")).endpoint == before
