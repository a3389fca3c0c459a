"""The Kubernetes NetworkPolicy e2e suite's cluster, and probes over it.

Namespaces x, y and z each hold pods a, b and c labelled ``pod: <name>``;
every pod serves ports 80 and 81 over TCP, UDP and SCTP, named like the e2e
suite's containers (``serve-80-tcp``). Pod x/a is 10.1.0.1, y/b 10.2.0.2,
and so on. All pods are on node-1, the agent's node, so all are local.
"""

from __future__ import annotations

import itertools

from cni.policy.explain import verdict
from cni.policy.index import PolicyIndex
from cni.policy.manifest import load_manifest
from cni.policy.model import PodKey

NAMESPACES = ("x", "y", "z")
POD_NAMES = ("a", "b", "c")
PODS: tuple[PodKey, ...] = tuple(itertools.product(NAMESPACES, POD_NAMES))
NODE = "node-1"


def address(pod: PodKey) -> str:
    return f"10.{NAMESPACES.index(pod[0]) + 1}.0.{POD_NAMES.index(pod[1]) + 1}"


def _pod_yaml(namespace: str, name: str) -> str:
    ports = "\n".join(
        f"      - {{name: serve-{port}-{proto.lower()}, containerPort: {port}, protocol: {proto}}}"
        for port in (80, 81)
        for proto in ("TCP", "UDP", "SCTP")
    )
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}, labels: {{pod: {name}}}}}
spec:
  nodeName: {NODE}
  containers:
    - name: cont-80-81
      image: agnhost
      ports:
{ports}
status: {{phase: Running, podIP: {address((namespace, name))}}}
"""


CLUSTER_YAML = "---".join(
    [
        f"\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{ns: {ns}}}}}\n"
        for ns in NAMESPACES
    ]
    + [_pod_yaml(ns, name) for ns, name in PODS]
)


def cluster(*manifests: str, node: str | None = NODE) -> PolicyIndex:
    """The e2e cluster plus the objects of ``manifests``."""
    index = PolicyIndex(node)
    for text in (CLUSTER_YAML, *manifests):
        for obj in load_manifest(text):
            index.upsert(obj)
    return index


def apply(index: PolicyIndex, manifest: str) -> frozenset[PodKey]:
    affected: set[PodKey] = set()
    for obj in load_manifest(manifest):
        affected |= index.upsert(obj)
    return frozenset(affected)


def can_connect(
    index: PolicyIndex, source: PodKey, target: PodKey, port: int = 80, protocol: str = "TCP"
) -> bool:
    """What the e2e probe sees: the source's egress and the target's ingress both allow it."""
    out = verdict(index, source, "egress", address(target), port, protocol).allowed
    into = verdict(index, target, "ingress", address(source), port, protocol).allowed
    return out and into


def reachability(
    index: PolicyIndex, port: int = 80, protocol: str = "TCP"
) -> set[tuple[PodKey, PodKey]]:
    """Every (source, target) pair of distinct pods that can connect."""
    return {
        (source, target)
        for source in PODS
        for target in PODS
        if source != target and can_connect(index, source, target, port, protocol)
    }


def everything() -> set[tuple[PodKey, PodKey]]:
    return {(s, t) for s in PODS for t in PODS if s != t}


def into(targets: set[PodKey], sources: set[PodKey] | None = None) -> set[tuple[PodKey, PodKey]]:
    """Pairs with a target in ``targets`` (and a source in ``sources``, default any)."""
    return {(s, t) for s, t in everything() if t in targets and (sources is None or s in sources)}


def out_of(sources: set[PodKey], targets: set[PodKey] | None = None) -> set[tuple[PodKey, PodKey]]:
    return {(s, t) for s, t in everything() if s in sources and (targets is None or t in targets)}


def in_namespace(namespace: str) -> set[PodKey]:
    return {pod for pod in PODS if pod[0] == namespace}


def not_in(namespace: str) -> set[PodKey]:
    return set(PODS) - in_namespace(namespace)


def policy(namespace: str, name: str, spec: str) -> str:
    """A NetworkPolicy manifest; ``spec`` is the YAML under ``spec:``, indented two spaces."""
    return f"""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
{spec}
"""
