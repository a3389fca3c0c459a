"""A ``policy_sequences.World`` as the Kubernetes API serves it: JSON objects, and the
watch events that take one state to the next.

Both the unit-level model check (objects parsed by sluice and fed to its resolvers)
and the cluster runner (objects applied with kubectl) start from these documents.
"""

from __future__ import annotations

from typing import Any

from tests.harness.policy_sequences import NAMESPACE_NAME_LABEL, World, port_specs

Document = dict[str, Any]
ObjectKey = tuple[str, str, str]  # (kind, namespace, name)


def namespace_document(world: World, ns: str) -> Document:
    real = world.real(ns)
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": real, "labels": {**world.namespaces[ns], NAMESPACE_NAME_LABEL: real}},
    }


def container_ports(flavour: str) -> list[Document]:
    return [
        {"name": spec.name, "containerPort": spec.port, "protocol": spec.protocol}
        for spec in port_specs(flavour)
    ]


def pod_document(world: World, key: tuple[str, str], node: str = "") -> Document:
    """The pod as the API reports it once running (with its address, when it has one)."""
    ns, name = key
    pod = world.pods[key]
    document: Document = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": world.real(ns),
            "labels": dict(pod.labels),
            "uid": f"uid-{world.real(ns)}-{name}-{pod.ip}",
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "ports": container_ports(pod.ports)}],
        },
        "status": {"phase": "Running"},
    }
    if pod.ip:
        document["status"]["podIP"] = pod.ip
        document["status"]["podIPs"] = [{"ip": pod.ip}]
    return document


def policy_document(world: World, key: tuple[str, str]) -> Document:
    ns, name = key
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": world.real(ns)},
        "spec": world.policies[key],
    }


def documents(world: World, node_of: Any = lambda key: "node-1") -> dict[ObjectKey, Document]:
    """Every object of the world by (kind, real namespace, name)."""
    out: dict[ObjectKey, Document] = {}
    for ns in world.namespaces:
        out[("Namespace", "", world.real(ns))] = namespace_document(world, ns)
    for key in world.pods:
        out[("Pod", world.real(key[0]), key[1])] = pod_document(world, key, node_of(key))
    for key in world.policies:
        out[("NetworkPolicy", world.real(key[0]), key[1])] = policy_document(world, key)
    return out


ORDER = {"Namespace": 0, "Pod": 1, "NetworkPolicy": 2}


def events(
    before: dict[ObjectKey, Document], after: dict[ObjectKey, Document]
) -> list[tuple[str, Document]]:
    """("upsert" | "delete", object) that take ``before`` to ``after``, in the order an
    API server's watches would deliver them: new namespaces before their pods and
    policies, deleted pods and policies before their namespace."""
    upserts = [
        ("upsert", doc)
        for key, doc in sorted(after.items(), key=lambda kv: (ORDER[kv[0][0]], kv[0]))
        if before.get(key) != doc
    ]
    deletes = [
        ("delete", doc)
        for key, doc in sorted(before.items(), key=lambda kv: (-ORDER[kv[0][0]], kv[0]))
        if key not in after
    ]
    return deletes + upserts
