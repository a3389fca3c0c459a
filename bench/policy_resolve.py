#!/usr/bin/env python3
"""The policy resolver at cluster scale: build, full resolve, incremental updates, memory.

A synthetic cluster: --namespaces namespaces (labels team, env), each with
the same share of --pods pods (10 apps of equal replicas; labels app, tier,
version; named container ports http, metrics, dns) spread over --nodes nodes,
and --policies policies in ten typical shapes per namespace: default deny,
allow from the namespace, app to app on a named port, from namespaces of a
team, both selectors with a port range, ipBlock with except, egress to DNS,
egress named port to a team's databases, matchExpressions, egress to the
internet and to every namespace. The agent is node-0's.

It prints: time to load everything, the resident memory, a full resolve of
every local pod, and for single updates (a pod label change, a new pod, a
namespace label change, a policy change) the local pods named as affected
and the time to apply the update and resolve those pods again.

    .venv/bin/python bench/policy_resolve.py [--pods 10000] [--policies 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

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

APPS = 10
TIERS = ("web", "api", "db")
PORTS = (
    ContainerPort("http", 8080, "TCP"),
    ContainerPort("metrics", 9090, "TCP"),
)
DNS_PORTS = (ContainerPort("dns", 53, "UDP"), ContainerPort("dns-tcp", 53, "TCP"))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def select(**labels: str) -> LabelSelector:
    return LabelSelector(labels_of(labels))


def namespaces(count: int) -> list[Namespace]:
    return [
        Namespace(
            f"ns-{i:03}",
            labels_of(
                {
                    "team": f"t{i % 10}",
                    "env": ("prod", "dev", "staging")[i % 3],
                    NAMESPACE_NAME_LABEL: f"ns-{i:03}",
                }
            ),
        )
        for i in range(count)
    ]


def pods(count: int, namespace_count: int, nodes: int) -> list[Pod]:
    per_namespace = count // namespace_count
    first = int(ipaddress.IPv4Address("10.64.0.1"))
    out = []
    for i in range(count):
        namespace, slot = divmod(i, per_namespace)
        app = slot % APPS
        out.append(
            Pod(
                namespace=f"ns-{namespace:03}",
                name=f"app-{app}-{slot // APPS}",
                labels=labels_of(
                    {
                        "app": f"app-{app}",
                        "tier": TIERS[app % 3],
                        "version": "v1",
                        "pod-template-hash": f"h{namespace}{app}",
                    }
                ),
                ips=(str(ipaddress.IPv4Address(first + i)),),
                # Spread so that node-0's pods are of every app and namespace.
                node_name=f"node-{(i + namespace) % nodes}",
                ports=PORTS + (DNS_PORTS if app == 0 else ()),
            )
        )
    return out


def policies(count: int, namespace_count: int) -> list[NetworkPolicy]:
    out = []
    for i in range(count):
        n = i // 10 % namespace_count
        ns, shape, team = f"ns-{n:03}", i % 10, f"t{n % 10}"
        name = f"np-{i}"
        app_number = (i // 10 + shape) % APPS  # targets vary from namespace to namespace
        app = select(app=f"app-{app_number}")
        if shape == 0:
            out.append(NetworkPolicy(ns, name, LabelSelector(), ("Ingress",)))
        elif shape == 1:
            rule = PolicyRule((Peer(pod_selector=LabelSelector()),))
            out.append(NetworkPolicy(ns, name, LabelSelector(), (), (rule,)))
        elif shape == 2:
            rule = PolicyRule(
                (Peer(pod_selector=select(app=f"app-{(app_number + 1) % APPS}")),),
                (PolicyPort("TCP", "http"),),
            )
            out.append(NetworkPolicy(ns, name, app, (), (rule,)))
        elif shape == 3:
            rule = PolicyRule(
                (Peer(namespace_selector=select(team=f"t{(n + 1) % 10}")),),
                (PolicyPort("TCP", 8080),),
            )
            out.append(NetworkPolicy(ns, name, select(tier="api"), (), (rule,)))
        elif shape == 4:
            rule = PolicyRule(
                (Peer(pod_selector=select(tier="web"), namespace_selector=select(env="prod")),),
                (PolicyPort("TCP", 8080, 8090),),
            )
            out.append(NetworkPolicy(ns, name, select(tier="api"), (), (rule,)))
        elif shape == 5:
            rule = PolicyRule(
                (Peer(ip_block=IPBlock("10.0.0.0/8", ("10.1.0.0/16",))),),
                (PolicyPort("TCP", 443),),
            )
            out.append(NetworkPolicy(ns, name, select(tier="web"), (), (rule,)))
        elif shape == 6:
            rule = PolicyRule(
                (
                    Peer(
                        pod_selector=select(app="app-0"),
                        namespace_selector=select(**{NAMESPACE_NAME_LABEL: "ns-000"}),
                    ),
                ),
                (PolicyPort("UDP", 53), PolicyPort("TCP", 53)),
            )
            out.append(NetworkPolicy(ns, name, LabelSelector(), ("Egress",), (), (rule,)))
        elif shape == 7:
            rule = PolicyRule(
                (Peer(pod_selector=select(tier="db"), namespace_selector=select(team=team)),),
                (PolicyPort("TCP", "http"),),
            )
            out.append(NetworkPolicy(ns, name, select(tier="api"), ("Egress",), (), (rule,)))
        elif shape == 8:
            target = LabelSelector(
                match_expressions=(Requirement("app", "In", frozenset({"app-1", "app-2"})),)
            )
            peer = LabelSelector(
                match_expressions=(
                    Requirement("tier", "NotIn", frozenset({"db"})),
                    Requirement("version", "Exists"),
                )
            )
            rule = PolicyRule((Peer(pod_selector=peer),), (PolicyPort("TCP", 9090),))
            out.append(NetworkPolicy(ns, name, target, (), (rule,)))
        else:
            rule = PolicyRule(
                (
                    Peer(ip_block=IPBlock("0.0.0.0/0", ("10.0.0.0/8",))),
                    Peer(namespace_selector=LabelSelector()),
                ),
            )
            out.append(NetworkPolicy(ns, name, select(tier="web"), ("Egress",), (), (rule,)))
    return out


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def apply_and_resolve(index: PolicyIndex, obj: KubeObject) -> tuple[float, int]:
    """Time to upsert ``obj`` and resolve the local pods it names again; how many it names."""
    start = time.perf_counter()
    affected = index.upsert(obj)
    for key in affected:
        if index.pod(key) is not None:
            index.resolve(key)
    return time.perf_counter() - start, len(affected)


def report(name: str, samples: list[tuple[float, int]]) -> None:
    times = sorted(t * 1000 for t, _ in samples)
    counts = [n for _, n in samples]
    print(
        f"  {name:<28} median {statistics.median(times):7.2f} ms  max {times[-1]:7.2f} ms"
        f"  affected local pods: median {statistics.median(counts):.0f}, max {max(counts)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=1_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20, help="updates of each kind")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    base_rss = rss_mb()
    all_namespaces = namespaces(args.namespaces)
    all_pods = pods(args.pods, args.namespaces, args.nodes)
    all_policies = policies(args.policies, args.namespaces)
    index = PolicyIndex("node-0")

    def load() -> None:
        everything: list[KubeObject] = [*all_namespaces, *all_pods, *all_policies]
        for obj in everything:
            index.upsert(obj)

    load_time, _ = timed(load)
    local = sorted(index.local_pods())
    print(
        f"cluster: {args.pods} pods, {args.policies} policies, {args.namespaces} namespaces, "
        f"{args.nodes} nodes; {len(local)} local pods; {len(index.groups)} distinct selectors"
    )
    print(f"load (upsert everything):     {load_time * 1000:8.1f} ms")

    full_time, results = timed(lambda: [index.resolve(key) for key in local])
    assert isinstance(results, list)
    rules = sum(len(r.endpoint.ingress or ()) + len(r.endpoint.egress or ()) for r in results)
    peers = sum(
        len(rule.peers)
        for r in results
        for rule in (*(r.endpoint.ingress or ()), *(r.endpoint.egress or ()))
    )
    print(
        f"full resolve, {len(local)} local pods: {full_time * 1000:8.1f} ms "
        f"({rules} allow rules, {peers} peer entries)"
    )
    cached_time, _ = timed(lambda: [index.resolve(key) for key in local])
    print(f"again, from the cache:        {cached_time * 1000:8.1f} ms")

    print(f"updates ({args.rounds} of each), time = apply + resolve the affected pods:")
    label_changes = []
    for _ in range(args.rounds):
        pod = rng.choice(all_pods)
        current = index.pod(pod.key)
        assert current is not None
        labels = dict(current.labels)
        app = rng.randrange(APPS)  # the pod becomes another app, maybe of another tier
        labels.update(app=f"app-{app}", tier=TIERS[app % 3])
        label_changes.append(apply_and_resolve(index, replace(current, labels=labels_of(labels))))
    report("pod label change", label_changes)

    new_pods = []
    for i in range(args.rounds):
        template = rng.choice(all_pods)
        new = replace(template, name=f"new-{i}", ips=(f"10.200.0.{i + 1}",))
        new_pods.append(apply_and_resolve(index, new))
    report("new pod (added as a peer)", new_pods)

    namespace_changes = []
    for _ in range(args.rounds):
        namespace = rng.choice(all_namespaces)
        labels = dict(namespace.labels)
        labels["team"] = f"t{rng.randrange(10)}"
        namespace_changes.append(
            apply_and_resolve(index, replace(namespace, labels=labels_of(labels)))
        )
    report("namespace label change", namespace_changes)

    policy_changes = []
    for _ in range(args.rounds):
        policy = rng.choice(all_policies)
        changed = replace(policy, pod_selector=select(app=f"app-{rng.randrange(APPS)}"))
        policy_changes.append(apply_and_resolve(index, changed))
    report("policy change", policy_changes)

    gc.collect()
    print(
        f"resident memory: {rss_mb():.1f} MB (interpreter and imports before loading: "
        f"{base_rss:.1f} MB)"
    )


if __name__ == "__main__":
    main()
