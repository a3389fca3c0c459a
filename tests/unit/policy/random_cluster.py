"""Random (small, valid) clusters and updates, for tests that compare two ways of computing."""

from __future__ import annotations

import random

from cni.policy.index import PolicyIndex
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    ContainerPort,
    IPBlock,
    KubeObject,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyPort,
    PolicyRule,
    Requirement,
    labels_of,
)

NAMESPACES = ("n0", "n1", "n2", "n3")
KEYS = ("app", "tier", "team")
VALUES = ("a", "b", "c")
PORT_NAMES = ("http", "dns", "metrics")
NODES = ("node-1", "node-2")


def labels(rng: random.Random) -> dict[str, str]:
    return {key: rng.choice(VALUES) for key in KEYS if rng.random() < 0.6}


def selector(rng: random.Random) -> LabelSelector:
    if rng.random() < 0.25:
        return LabelSelector()
    pairs = {key: rng.choice(VALUES) for key in KEYS if rng.random() < 0.3}
    expressions = []
    if rng.random() < 0.4:
        operator = rng.choice(("In", "NotIn", "Exists", "DoesNotExist"))
        values = (
            frozenset(rng.sample(VALUES, rng.randint(1, 2)))
            if operator in ("In", "NotIn")
            else frozenset()
        )
        expressions.append(Requirement(rng.choice(KEYS), operator, values))
    return LabelSelector(labels_of(pairs), tuple(expressions))


def namespace(rng: random.Random, name: str) -> Namespace:
    return Namespace(name, labels_of({**labels(rng), NAMESPACE_NAME_LABEL: name}))


def pod(rng: random.Random, number: int) -> Pod:
    roll = rng.random()
    if roll < 0.1:
        ips: tuple[str, ...] = ()
    elif roll < 0.2:
        ips = (f"10.0.{number // 250}.{number % 250 + 1}", f"fd00::{number + 1:x}")
    else:
        ips = (f"10.0.{number // 250}.{number % 250 + 1}",)
    ports = tuple(
        ContainerPort(name, rng.choice((80, 53, 9100)), rng.choice(("TCP", "UDP")))
        for name in PORT_NAMES
        if rng.random() < 0.5
    )
    return Pod(
        namespace=rng.choice(NAMESPACES),
        name=f"p{number}",
        labels=labels_of(labels(rng)),
        ips=ips,
        node_name=rng.choice(NODES),
        ports=ports,
        host_network=rng.random() < 0.05,
        uid=f"uid-p{number}",
    )


def peer(rng: random.Random) -> Peer:
    kind = rng.randrange(4)
    if kind == 0:
        return Peer(pod_selector=selector(rng))
    if kind == 1:
        return Peer(namespace_selector=selector(rng))
    if kind == 2:
        return Peer(pod_selector=selector(rng), namespace_selector=selector(rng))
    cidr = rng.choice(("10.0.0.0/24", "10.0.0.0/16", "10.0.0.0/28", "0.0.0.0/0", "fd00::/64"))
    excepts: tuple[str, ...] = ()
    if cidr == "10.0.0.0/16" and rng.random() < 0.5:
        excepts = ("10.0.0.0/26",)
    if cidr == "0.0.0.0/0" and rng.random() < 0.5:
        excepts = ("10.0.0.8/29", "192.168.0.0/16")
    return Peer(ip_block=IPBlock(cidr, excepts))


def policy_port(rng: random.Random) -> PolicyPort:
    protocol = rng.choice(("TCP", "UDP", "SCTP"))
    kind = rng.randrange(4)
    if kind == 0:
        return PolicyPort(protocol, None)
    if kind == 1:
        return PolicyPort(protocol, rng.choice((53, 80, 9100)))
    if kind == 2:
        first = rng.choice((50, 80, 9000))
        return PolicyPort(protocol, first, first + rng.choice((0, 10, 200)))
    return PolicyPort(protocol, rng.choice(PORT_NAMES))


def rule(rng: random.Random) -> PolicyRule:
    peers = tuple(peer(rng) for _ in range(rng.choice((0, 1, 1, 2, 3))))
    ports = tuple(policy_port(rng) for _ in range(rng.choice((0, 1, 2))))
    return PolicyRule(peers, ports)


def policy(rng: random.Random, number: int) -> NetworkPolicy:
    types = rng.choice(((), ("Ingress",), ("Egress",), ("Ingress", "Egress")))
    return NetworkPolicy(
        namespace=rng.choice(NAMESPACES),
        name=f"np{number}",
        pod_selector=selector(rng),
        policy_types=types,
        ingress=tuple(rule(rng) for _ in range(rng.choice((0, 1, 2)))),
        egress=tuple(rule(rng) for _ in range(rng.choice((0, 1, 2)))),
    )


def cluster(rng: random.Random, pods: int = 24, policies: int = 8) -> list[KubeObject]:
    objects: list[KubeObject] = [namespace(rng, n) for n in NAMESPACES[:-1]]  # n3: implicit
    objects += [pod(rng, i) for i in range(pods)]
    objects += [policy(rng, i) for i in range(policies)]
    return objects


def index_of(objects: list[KubeObject], node: str | None = "node-1") -> PolicyIndex:
    index = PolicyIndex(node)
    for obj in objects:
        index.upsert(obj)
    return index


def snapshot(index: PolicyIndex) -> list[KubeObject]:
    """Every object the index holds."""
    return [
        *index.store.namespaces.values(),
        *index.store.all_pods(),
        *index.store.policies.values(),
    ]


def update(rng: random.Random, index: PolicyIndex, serial: int) -> tuple[str, KubeObject]:
    """A random change: ("upsert" or "delete", object)."""
    pods = list(index.store.all_pods())
    policies = list(index.store.policies.values())
    roll = rng.randrange(9)
    if roll == 0 and pods:
        old = rng.choice(pods)
        new = Pod(
            old.namespace,
            old.name,
            labels_of(labels(rng)),
            old.ips,
            old.node_name,
            old.ports,
            old.host_network,
            old.uid,
        )
        return "upsert", new
    if roll == 1 and pods:
        old = rng.choice(pods)
        fresh = pod(rng, 500 + serial)
        return "upsert", Pod(
            old.namespace,
            old.name,
            old.labels,
            fresh.ips,
            old.node_name,
            fresh.ports,
            old.host_network,
            old.uid,
        )
    if roll == 2:
        return "upsert", pod(rng, 1000 + serial)
    if roll == 3 and pods:
        return "delete", rng.choice(pods)
    if roll == 4:
        return "upsert", namespace(rng, rng.choice(NAMESPACES))
    if roll == 5 and index.store.namespaces:
        name = rng.choice(sorted(index.store.namespaces))
        return "delete", index.store.namespaces[name]
    if roll == 6 and policies:
        return "delete", rng.choice(policies)
    if roll == 7 and policies:
        current = rng.choice(policies)
        spec = policy(rng, serial)
        return "upsert", NetworkPolicy(
            current.namespace,
            current.name,
            spec.pod_selector,
            spec.policy_types,
            spec.ingress,
            spec.egress,
        )
    return "upsert", policy(rng, 100 + serial)
