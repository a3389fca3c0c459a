"""Prefix claims in the Kubernetes API, for tests: Nodes without kubelets, the
agent's RBAC, reading the PrefixClaim objects (the fixtures: ``claims_fixtures``)."""

from __future__ import annotations

import ipaddress
import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.harness.cluster import Cluster

CRD = Path(__file__).resolve().parents[2] / "conf" / "prefixclaims.yaml"
AGENT_ACCOUNT = "sluice-agent-claims"

# What the agent's ServiceAccount needs for prefix claims (docs/ipam.md).
AGENT_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["sluice.dev"],
        "resources": ["prefixclaims"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": ["sluice.dev"], "resources": ["prefixclaims/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def apply(cluster: Cluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))


def unique_pool() -> str:
    """A /22 of 10.128.0.0/9 nobody else in this session uses (claims outlive tests)."""
    base = ipaddress.IPv4Network("10.128.0.0/9")
    index = uuid.uuid4().int % (2 ** (22 - base.prefixlen))
    return str(ipaddress.IPv4Network((int(base.network_address) + index * 1024, 22)))


def create_node(cluster: Cluster, name: str) -> str:
    """A Node without a kubelet (nothing evicts or deletes it here); its uid."""
    apply(cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return str(cluster.kubectl_json("get", "node", name)["metadata"]["uid"])


def delete_node(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


def claim_objects(cluster: Cluster, pool: str | None = None) -> list[dict[str, Any]]:
    """PrefixClaims, of one pool when given."""
    items = cluster.kubectl_json("get", "prefixclaims")["items"]
    if pool is None:
        return list(items)
    return [o for o in items if o["spec"]["pool"] == pool]


def claims_by_node(cluster: Cluster, pool: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for obj in claim_objects(cluster, pool):
        found.setdefault(obj["spec"]["node"], []).append(obj["spec"]["prefix"])
    return {node: sorted(blocks, key=ipaddress.IPv4Network) for node, blocks in found.items()}


def node_events(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    return list(cluster.kubectl_json("get", "events", "-A", "--field-selector", selector)["items"])


def prefix_ipam(pool: str, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "sluice-ipam",
        "mode": "prefix",
        "pool": pool,
        "claimStore": "kubernetes",
        "nodeName": node,
        **extra,
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
