"""Kubernetes objects from the resolver's model, created on a real API server: Nodes
that no kubelet runs, Pods bound to them with addresses set through the status
subresource (as a kubelet would), Namespaces and NetworkPolicies.

For the controller's tests and ``bench/k8s_scale.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni.kube.api import Api, ApiError
from cni.policy.model import Namespace, NetworkPolicy, Pod, label_dict
from cni.policy.render import policy_spec_json


def node_json(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def namespace_json(namespace: Namespace) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace.name, "labels": label_dict(namespace.labels)},
    }


def pod_json(pod: Pod) -> dict[str, Any]:
    ports = [
        {"containerPort": p.port, "protocol": p.protocol, **({"name": p.name} if p.name else {})}
        for p in pod.ports
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": label_dict(pod.labels),
        },
        "spec": {
            "nodeName": pod.node_name,
            "automountServiceAccountToken": False,
            "hostNetwork": pod.host_network,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "ports": ports}],
        },
    }


def pod_status_json(ips: Sequence[str]) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if ips:
        status["podIP"] = ips[0]
        status["podIPs"] = [{"ip": ip} for ip in ips]
    return {"status": status}


def policy_json(policy: NetworkPolicy) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy.name, "namespace": policy.namespace},
        "spec": policy_spec_json(policy),
    }


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def policy_path(namespace: str, name: str) -> str:
    return f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}"


def wait_service_account(api: Api, namespace: str, timeout: float = 30.0) -> None:
    """Pods are refused until the namespace's default ServiceAccount exists."""
    deadline = time.monotonic() + timeout
    while api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no ServiceAccount default in namespace {namespace}")
        time.sleep(0.2)


def create_pod(api: Api, pod: Pod) -> None:
    api.create(f"/api/v1/namespaces/{pod.namespace}/pods", pod_json(pod))
    if pod.ips:
        set_pod_ips(api, pod.namespace, pod.name, pod.ips)


def set_pod_ips(api: Api, namespace: str, name: str, ips: Sequence[str]) -> None:
    api.patch(pod_path(namespace, name) + "/status", pod_status_json(ips))


def create_world(
    api: Api,
    nodes: Iterable[str] = (),
    namespaces: Iterable[Namespace] = (),
    pods: Iterable[Pod] = (),
    policies: Iterable[NetworkPolicy] = (),
    workers: int = 8,
) -> None:
    """Create everything, in that order, ``workers`` requests at a time."""
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: _create(api, "/api/v1/nodes", node_json(n)), nodes))
        namespaces = list(namespaces)
        list(pool.map(lambda n: _create(api, "/api/v1/namespaces", namespace_json(n)), namespaces))
        for namespace in namespaces:
            wait_service_account(api, namespace.name)
        list(pool.map(lambda p: create_pod(api, p), pods))
        list(
            pool.map(
                lambda p: _create(
                    api,
                    f"/apis/networking.k8s.io/v1/namespaces/{p.namespace}/networkpolicies",
                    policy_json(p),
                ),
                policies,
            )
        )


def _create(api: Api, collection: str, body: dict[str, Any]) -> None:
    try:
        api.create(collection, body)
    except ApiError as err:
        if err.status != 409:  # already there (a node shared by several tests)
            raise
