"""The controller's objects as it writes them (API JSON): a policy's PolicyEndpoints,
an address set's shards, a node's PolicyTargets. Their names and labels come from
``names``; ``shards`` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cni.policy.model import ContainerPort, NetworkPolicy, Pod
from cni.policy.published.names import (
    ADDRESS_SET,
    ADDRESS_SET_LABEL,
    API_VERSION,
    MANAGED_BY,
    POLICY_ENDPOINTS,
    POLICY_LABEL,
    POLICY_TARGETS,
    TARGETS_NODE_LABEL,
    address_set_id,
    address_set_name,
    node_label,
    node_label_key,
    pod_name,
    policy_endpoints_name,
    policy_label,
    policy_targets_name,
)
from cni.policy.published.sets import AddressSetKey
from cni.policy.published.shards import TargetEntry
from cni.policy.render import group_json, policy_spec_json


def _metadata(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": {**MANAGED_BY, **labels}}


def node_labels(nodes: Sequence[str]) -> dict[str, str]:
    return {node_label_key(node): "" for node in sorted(nodes)}


def policy_endpoints_object(
    policy: NetworkPolicy,
    uid: str,
    generation: int,
    address_sets: Sequence[str],
    nodes: Sequence[str],
) -> dict[str, Any]:
    """The PolicyEndpoints of a policy: ``address_sets`` are the ids of
    ``published.address_sets(policy)``, in that order."""
    labels = {POLICY_LABEL: policy_label(policy.name), **node_labels(nodes)}
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_ENDPOINTS,
        "metadata": _metadata(policy_endpoints_name(policy.namespace, policy.name), labels),
        "spec": {
            "policyNamespace": policy.namespace,
            "policyName": policy.name,
            "policyUID": uid,
            "policyGeneration": generation,
            "shardIndex": 0,
            "shardCount": 1,
            "policy": policy_spec_json(policy),
            "addressSets": list(address_sets),
        },
    }


def _port_json(port: ContainerPort) -> dict[str, Any]:
    return {"name": port.name, "port": port.port, "protocol": port.protocol}


def address_set_object(
    key: AddressSetKey,
    index: int,
    count: int,
    pods: Sequence[Pod],
    nodes: Sequence[str],
) -> dict[str, Any]:
    """One shard of an address set: ``pods`` (members the set admits) in key order."""
    set_id = address_set_id(key)
    entries = []
    for pod in pods:
        entry: dict[str, Any] = {"pod": pod_name(pod.key), "ips": list(pod.ips)}
        ports = key.published_ports(pod)
        if ports:
            entry["ports"] = [_port_json(port) for port in ports]
        entries.append(entry)
    spec: dict[str, Any] = {"setID": set_id, "shardIndex": index, "shardCount": count}
    if index == 0:  # what the set is, said once
        selector: dict[str, Any] = {**group_json(key.group), "ports": key.ports}
        if key.only_named is not None:
            selector["onlyNamedPorts"] = [
                {"name": name, "protocol": protocol} for name, protocol in sorted(key.only_named)
            ]
        spec["selector"] = selector
    spec["pods"] = entries
    labels = {ADDRESS_SET_LABEL: set_id, **node_labels(nodes)}
    return {
        "apiVersion": API_VERSION,
        "kind": ADDRESS_SET,
        "metadata": _metadata(address_set_name(set_id, index), labels),
        "spec": spec,
    }


def policy_targets_object(
    node: str, index: int, count: int, entries: Sequence[TargetEntry]
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_TARGETS,
        "metadata": _metadata(
            policy_targets_name(node, index), {TARGETS_NODE_LABEL: node_label(node)}
        ),
        "spec": {
            "nodeName": node,
            "shardIndex": index,
            "shardCount": count,
            "pods": [
                {"pod": pod_name(e.pod), "uid": e.uid, "policies": list(e.policies)}
                for e in entries
            ],
        },
    }
