"""Updates: results follow the objects, and updates name exactly the pods to recompute."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cni.policy.index import PolicyIndex
from cni.policy.manifest import load_manifest
from cni.policy.model import NetworkPolicy, Pod, PodKey, labels_of
from cni.policy.vocabulary import AllowRule, PeerCIDR
from tests.unit.policy import random_cluster
from tests.unit.policy.cluster import (
    apply,
    can_connect,
    cluster,
    everything,
    policy,
    reachability,
)

X_A = ("x", "a")
ALLOW_FROM_B = policy(
    "x",
    "allow-b",
    """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]""",
)


def relabel(index: PolicyIndex, key: PodKey, **labels: str) -> frozenset[PodKey]:
    pod = index.pod(key)
    assert pod is not None
    return index.upsert_pod(
        Pod(pod.namespace, pod.name, labels_of(labels), pod.ips, pod.node_name, pod.ports)
    )


def test_peer_label_change_recomputes_the_targets_of_policies_that_use_it() -> None:
    index = cluster(ALLOW_FROM_B)
    assert not can_connect(index, ("x", "c"), X_A)
    affected = relabel(index, ("x", "c"), pod="b")
    assert affected == {X_A, ("x", "c")}
    assert can_connect(index, ("x", "c"), X_A)


def test_unrelated_label_change_recomputes_only_that_pod() -> None:
    index = cluster(ALLOW_FROM_B)
    assert relabel(index, ("z", "c"), pod="c", extra="yes") == {("z", "c")}


def test_target_label_change() -> None:
    index = cluster(ALLOW_FROM_B)
    assert relabel(index, X_A, pod="not-a") == {X_A}
    assert index.resolve(X_A).endpoint.ingress is None


def test_namespace_label_change() -> None:
    index = cluster(
        policy(
            "x",
            "from-team",
            """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: blue}}}]}]""",
        )
    )
    assert not can_connect(index, ("z", "b"), X_A)
    affected = apply(index, "kind: Namespace\nmetadata: {name: z, labels: {team: blue}}")
    assert affected == {X_A}
    assert can_connect(index, ("z", "b"), X_A)
    assert apply(index, "kind: Namespace\nmetadata: {name: z, labels: {team: red}}") == {X_A}
    assert not can_connect(index, ("z", "b"), X_A)
    # A label no selector reads changes nobody's policy.
    assert apply(index, "kind: Namespace\nmetadata: {name: y, labels: {other: 1x}}") == set()


def test_policy_update_and_delete() -> None:
    index = cluster(ALLOW_FROM_B)
    moved = ALLOW_FROM_B.replace("{matchLabels: {pod: a}}", "{matchLabels: {pod: c}}")
    assert apply(index, moved) == {X_A, ("x", "c")}
    assert index.resolve(X_A).endpoint.ingress is None
    assert index.resolve(("x", "c")).endpoint.ingress is not None
    (obj,) = load_manifest(moved)
    assert index.delete(obj) == {("x", "c")}
    assert reachability(index) == everything()
    assert index.delete(obj) == set()


def test_reapplying_the_same_objects_changes_nothing() -> None:
    index = cluster(ALLOW_FROM_B)
    assert apply(index, ALLOW_FROM_B) == set()
    pod = index.pod(X_A)
    assert pod is not None and index.upsert(pod) == set()


def test_pod_address_change_updates_peers() -> None:
    index = cluster(ALLOW_FROM_B)
    pod = index.pod(("x", "b"))
    assert pod is not None
    affected = index.upsert_pod(
        Pod(pod.namespace, pod.name, pod.labels, ("10.9.9.9",), pod.node_name, pod.ports)
    )
    assert affected == {X_A, ("x", "b")}
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None and ingress[0] == AllowRule((PeerCIDR("10.9.9.9/32"),), ())


def test_pods_without_address_are_no_peers_until_they_get_one() -> None:
    index = cluster(ALLOW_FROM_B)
    new_pod = """
kind: Pod
metadata: {name: d, namespace: x, labels: {pod: b}}
spec: {nodeName: node-1}
"""
    assert apply(index, new_pod) == {X_A, ("x", "d")}
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None
    assert [p.cidr for p in ingress[0].peers] == ["10.1.0.2/32"]  # x/b only
    # The new pod, itself selected by nothing, has no self rule to add either.
    assert index.resolve(("x", "d")).endpoint.ingress is None
    # The agent addresses it at ADD.
    pod = index.pod(("x", "d"))
    assert pod is not None
    assert index.upsert_pod(
        Pod(pod.namespace, pod.name, pod.labels, ("10.1.0.4",), pod.node_name)
    ) == {X_A, ("x", "d")}
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None
    assert [p.cidr for p in ingress[0].peers] == ["10.1.0.2/32", "10.1.0.4/32"]


def test_deleted_pod() -> None:
    index = cluster(ALLOW_FROM_B)
    assert index.delete_pod(("x", "b")) == {X_A, ("x", "b")}
    with pytest.raises(KeyError):
        index.resolve(("x", "b"))
    assert index.resolve(X_A).endpoint.ingress == ()


def test_only_pods_of_the_agents_node_are_local() -> None:
    index = cluster(ALLOW_FROM_B, node="node-2")
    assert index.local_pods() == frozenset()
    assert relabel(index, ("x", "c"), pod="b") == set()
    # Any pod can still be resolved (not cached).
    assert index.resolve(X_A).endpoint.ingress is not None


def test_host_network_pods_are_no_targets_but_their_address_is_a_peer() -> None:
    host_pod = """
kind: Pod
metadata: {name: h, namespace: x, labels: {pod: b}}
spec: {nodeName: node-1, hostNetwork: true}
status: {podIP: 192.168.1.10}
"""
    deny_all = policy("x", "deny", "  podSelector: {}\n  policyTypes: [Ingress, Egress]")
    index = cluster(ALLOW_FROM_B, deny_all, host_pod)
    resolved = index.resolve(("x", "h"))
    assert resolved.endpoint.ingress is None and resolved.endpoint.egress is None
    assert resolved.selected_by == ()
    assert ("x", "h") not in index.local_pods()
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None
    assert PeerCIDR("192.168.1.10/32") in ingress[0].peers


def test_pods_of_an_undeclared_namespace_get_its_name_label() -> None:
    index = cluster(
        policy(
            "x",
            "from-w",
            """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: w}}}]}]""",
        )
    )
    stranger = "kind: Pod\nmetadata: {name: s, namespace: w}\nstatus: {podIP: 10.8.0.1}"
    assert apply(index, stranger) == {X_A}
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None and ingress[0].peers == (PeerCIDR("10.8.0.1/32"),)
    assert index.delete_pod(("w", "s")) == {X_A}
    assert index.resolve(X_A).endpoint.ingress == ()


def test_replace_all_after_a_relist() -> None:
    index = cluster(ALLOW_FROM_B)
    relisted = [p for p in index.store.all_pods() if p.key != ("x", "b")]
    relisted = [
        replace(p, labels=labels_of({"pod": "b"})) if p.key == ("x", "c") else p for p in relisted
    ]
    assert index.replace_all(Pod, relisted) == {X_A, ("x", "b"), ("x", "c")}
    assert index.pod(("x", "b")) is None
    ingress = index.resolve(X_A).endpoint.ingress
    assert ingress is not None and ingress[0].peers == (PeerCIDR("10.1.0.3/32"),)
    with pytest.raises(TypeError):
        index.replace_all(Pod, [index.store.namespaces["x"]])
    assert index.replace_all(NetworkPolicy, []) == {X_A}
    assert index.resolve(X_A).endpoint.ingress is None


@pytest.mark.parametrize("seed", range(12))
def test_incremental_state_matches_a_fresh_index_and_names_every_changed_pod(seed: int) -> None:
    """After each random update: every local pod resolves as a freshly built index
    resolves it, and a pod the update did not name has the result it had before."""
    rng = random.Random(seed)
    index = random_cluster.index_of(random_cluster.cluster(rng))
    for serial in range(40):
        before = {key: index.resolve(key) for key in index.local_pods()}
        action, obj = random_cluster.update(rng, index, serial)
        affected = index.upsert(obj) if action == "upsert" else index.delete(obj)
        objects = random_cluster.snapshot(index)
        rng.shuffle(objects)
        fresh = random_cluster.index_of(objects)
        assert fresh.local_pods() == index.local_pods()
        for key in index.local_pods():
            expected = fresh.resolve(key)
            assert index.resolve(key) == expected, (seed, serial, action, obj, key)
            if key not in affected and key in before:
                assert before[key] == expected, (seed, serial, action, obj, key)
