"""An agent resolving from the controller's objects computes exactly what it computes
resolving on its own: random clusters and random updates, every local pod compared."""

from __future__ import annotations

import random

import pytest

from cni.controller.publisher import Publisher
from cni.policy.errors import PolicyIncomplete
from cni.policy.index import PolicyIndex
from cni.policy.model import KubeObject, Namespace, NetworkPolicy, Pod
from cni.policy.published.index import ShardIndex
from cni.policy.published.names import POLICY_TARGETS
from tests.unit.controller.published_api import PublishedStore, publish
from tests.unit.policy import random_cluster

NODES = random_cluster.NODES


def feed_publisher(publisher: Publisher, verb: str, obj: KubeObject, generation: int) -> None:
    if isinstance(obj, Pod):
        if verb == "delete":
            publisher.remove_pod(obj.key)
        else:
            publisher.put_pod(obj)
    elif isinstance(obj, Namespace):
        if verb == "delete":
            publisher.remove_namespace(obj.name)
        else:
            publisher.put_namespace(obj)
    elif isinstance(obj, NetworkPolicy):
        if verb == "delete":
            publisher.remove_policy(obj.key)
        else:
            publisher.put_policy(obj, f"uid-{obj.namespace}-{obj.name}", generation)


def agent_of(store: PublishedStore, reference: PolicyIndex, node: str) -> ShardIndex:
    index = ShardIndex(node)
    for key in reference.local_pods():
        pod = reference.pod(key)
        assert pod is not None
        index.upsert_pod(pod)
    store.feed(index)
    return index


def assert_same(reference: PolicyIndex, agent: ShardIndex, context: str) -> None:
    for key in sorted(reference.local_pods()):
        want = reference.resolve(key)
        got = agent.resolve(key)
        assert got.endpoint == want.endpoint, f"{context}: pod {key}"
        assert got.selected_by == want.selected_by, f"{context}: pod {key}"


@pytest.mark.parametrize("capacity", [4, 200])
def test_agent_computes_what_local_resolution_computes(capacity: int) -> None:
    for seed in range(25):
        rng = random.Random(seed)
        cluster = random_cluster.cluster(rng, pods=30, policies=10)
        publisher = Publisher(capacity=capacity, targets_capacity=capacity)
        store = PublishedStore()
        for obj in cluster:
            feed_publisher(publisher, "upsert", obj, 1)
        publisher.recompute_everything()
        publish(publisher, store)
        references = {node: random_cluster.index_of(cluster, node) for node in NODES}
        for node in NODES:
            assert_same(references[node], agent_of(store, references[node], node), f"seed {seed}")

        for serial in range(12):
            verb, obj = random_cluster.update(rng, references[NODES[0]], serial)
            feed_publisher(publisher, verb, obj, 2 + serial)
            for reference in references.values():
                (reference.delete if verb == "delete" else reference.upsert)(obj)
            publish(publisher, store)
            for node in NODES:
                agent = agent_of(store, references[node], node)
                assert_same(references[node], agent, f"seed {seed}, update {serial} {verb}")


def test_a_pod_the_controller_has_not_listed_is_incomplete() -> None:
    rng = random.Random(7)
    cluster = random_cluster.cluster(rng, pods=10, policies=4)
    publisher = Publisher()
    store = PublishedStore()
    for obj in cluster:
        feed_publisher(publisher, "upsert", obj, 1)
    publish(publisher, store)
    agent = ShardIndex("node-1")
    store.feed(agent)
    newcomer = Pod("n0", "newcomer", node_name="node-1", uid="u-1")
    agent.upsert_pod(newcomer)
    assert agent.incomplete(newcomer.key) is not None
    with pytest.raises(PolicyIncomplete, match="has not published pod n0/newcomer"):
        agent.resolve(newcomer.key)
    publisher.put_pod(newcomer)
    publish(publisher, store)
    store.feed(agent)
    assert agent.incomplete(newcomer.key) is None
    # An earlier pod of that name (another uid) is not this one.
    agent.upsert_pod(Pod("n0", "newcomer", node_name="node-1", uid="u-2"))
    assert agent.incomplete(newcomer.key) is not None


def test_a_targets_entry_without_uid_is_nobodys() -> None:
    """An entry that names no uid cannot be told from an earlier pod of that name."""
    publisher = Publisher()
    store = PublishedStore()
    pod = Pod("n0", "target", node_name="node-1", uid="u-1")
    for obj in (pod, NetworkPolicy("n0", "deny-all")):
        feed_publisher(publisher, "upsert", obj, 1)
    publish(publisher, store)
    ((_, body),) = [(k, b) for k, b in store.objects.items() if k[0] == POLICY_TARGETS]
    for entry in body["spec"]["pods"]:
        entry["uid"] = ""
    agent = ShardIndex("node-1")
    agent.upsert_pod(pod)
    store.feed(agent)
    assert "has not published pod n0/target" in str(agent.incomplete(pod.key))
