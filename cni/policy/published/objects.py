"""The controller's objects (group ``sluice.dev``, version ``v1alpha1``; CRDs in
``conf/policyendpoints.yaml``): names, labels, and their JSON in and out.

All three kinds are cluster-scoped: a Role, which is all a namespace's tenant can
be given, grants nothing on cluster-scoped kinds, so only a ClusterRole can let
anyone write them (``conf/sluice-rbac.yaml`` lets the controller alone; see
docs/security.md, Trust model).

- ``PolicyEndpoints`` (one per NetworkPolicy, named ``<namespace>.<name>``):
  the policy's namespace, name, uid and generation, its rules as the resolver
  reads them, and the names of the address sets that hold the pods its
  selectors pick. Labelled ``node.sluice.dev/<node>`` for every node that
  hosts a pod the policy selects. It has no owner reference: a cluster-scoped
  object cannot be owned by a namespaced one (the garbage collector never
  collects it and reports ``OwnerRefInvalidNamespace``); the controller
  deletes the PolicyEndpoints of a policy that is gone.
- ``AddressSet`` (cluster-scoped, sharded): the pods of one distinct selector
  group (name, addresses, named ports when a policy needs them), shared by
  every policy that has that selector. Labelled ``node.sluice.dev/<node>`` for
  every node that hosts a pod selected by a policy that reads the set.
- ``PolicyTargets`` (cluster-scoped, sharded, one set per node): every pod the
  controller knows on the node (name, uid) with the policies that select it.
  Labelled ``sluice.dev/node: <node>``.

Every object is one shard of a set and says so: ``shardIndex``, ``shardCount``,
and what makes the set's shards belong together (the policy's uid and
generation; the address set's id; the node). A set is complete when shards
``0..shardCount-1`` are all present and agree on that (see ``shardsets``).

Only the controller's objects count (``written_by_controller``): an object is
read only when its name is the one its spec derives (so that two objects can
never claim one shard: the API server keeps names unique), it carries the
managed-by label, and a PolicyEndpoints names its policy's uid. Agents drop any
other object; the controller deletes it.

Node names longer than a label allows (63) are shortened with a hash
(``node_label``); so are object names built from long policy names.
"""

from __future__ import annotations

import hashlib
import json
import sys
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.model import (
    NO_LABELS,
    ContainerPort,
    NetworkPolicy,
    Pod,
    PodKey,
    PolicyKey,
    labels_of,
)
from cni.policy.parse import parse_network_policy
from cni.policy.published.sets import AddressSetKey
from cni.policy.render import group_json, policy_spec_json

GROUP = "sluice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
API_BASE = f"/apis/{GROUP}/{VERSION}"

POLICY_ENDPOINTS = "PolicyEndpoints"
ADDRESS_SET = "AddressSet"
POLICY_TARGETS = "PolicyTargets"
PLURALS = {
    POLICY_ENDPOINTS: "policyendpoints",
    ADDRESS_SET: "addresssets",
    POLICY_TARGETS: "policytargets",
}

NODE_LABEL_PREFIX = "node.sluice.dev/"  # + node: on sets a node needs
TARGETS_NODE_LABEL = "sluice.dev/node"  # = node: on a node's PolicyTargets
POLICY_LABEL = "sluice.dev/policy"  # = policy name, on PolicyEndpoints
ADDRESS_SET_LABEL = "sluice.dev/address-set"  # = set id, on AddressSets
MANAGED_BY = {"app.kubernetes.io/managed-by": "sluice-controller"}

LABEL_LIMIT = 63
NAME_LIMIT = 253


def _shortened(text: str, limit: int) -> str:
    """``text``, or its head and a hash of the whole when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[: limit - 17].rstrip('-.')}-{digest}"


def node_label(node: str) -> str:
    """A node name as a label name or value (node names may be longer than 63)."""
    return _shortened(node, LABEL_LIMIT)


def node_label_key(node: str) -> str:
    return NODE_LABEL_PREFIX + node_label(node)


def collection_path(kind: str) -> str:
    return f"{API_BASE}/{PLURALS[kind]}"


def object_path(kind: str, name: str) -> str:
    return f"{collection_path(kind)}/{name}"


def spec_hash(spec: Mapping[str, Any]) -> str:
    """A digest of a spec's content, the same for what the controller writes and what
    the API server returns (it keeps a CRD's JSON as written, keys sorted)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pod_name(key: PodKey) -> str:
    return f"{key[0]}/{key[1]}"


# -- identities ------------------------------------------------------------------------


def address_set_id(key: AddressSetKey) -> str:
    """A stable name for an address set: a digest of what it holds."""
    described = {"group": group_json(key.group), "ports": key.ports}
    if key.only_named is not None:
        described["onlyNamedPorts"] = sorted(key.only_named)
    return "as-" + spec_hash(described)[:20]


def policy_endpoints_name(namespace: str, policy: str) -> str:
    """One object per policy: a namespace name has no dot, so the first one separates."""
    return _shortened(f"{namespace}.{policy}", NAME_LIMIT)


def address_set_name(set_id: str, index: int) -> str:
    return f"{set_id}-{index}"


def policy_targets_name(node: str, index: int) -> str:
    return f"{_shortened(node, NAME_LIMIT - 8)}-{index}"


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What every published object says about itself, and what the controller keeps
    of the objects it finds (never their content: a digest of it). One subclass per
    kind (``INFO_TYPES``), so that receivers take them by type."""

    kind: str
    name: str
    set_namespace: str  # the policy's namespace (PolicyEndpoints), else ""
    set_name: str  # the policy, the address set id, the node
    version: tuple[str, ...]  # shards of one version of a set belong together
    index: int
    count: int
    labels: frozenset[tuple[str, str]] = frozenset()
    resource_version: str = ""
    content: str = ""  # spec_hash of the spec
    foreign: str = ""  # why the controller did not write it as it is ("": it did)

    @property
    def set_key(self) -> tuple[str, str, str]:
        return (self.kind, self.set_namespace, self.set_name)

    @property
    def object_key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    @property
    def derived_name(self) -> str:
        """The name the controller gives the object its spec describes."""
        raise NotImplementedError(f"{type(self).__name__} names no kind")


@dataclass(frozen=True, slots=True)
class PolicyEndpointsInfo(ShardInfo):
    @property
    def derived_name(self) -> str:
        return policy_endpoints_name(self.set_namespace, self.set_name)


@dataclass(frozen=True, slots=True)
class AddressSetInfo(ShardInfo):
    @property
    def derived_name(self) -> str:
        return address_set_name(self.set_name, self.index)


@dataclass(frozen=True, slots=True)
class PolicyTargetsInfo(ShardInfo):
    @property
    def derived_name(self) -> str:
        return policy_targets_name(self.set_name, self.index)


INFO_TYPES: dict[str, type[ShardInfo]] = {
    POLICY_ENDPOINTS: PolicyEndpointsInfo,
    ADDRESS_SET: AddressSetInfo,
    POLICY_TARGETS: PolicyTargetsInfo,
}


# -- writing (the controller) ----------------------------------------------------------


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
    labels = {POLICY_LABEL: _shortened(policy.name, LABEL_LIMIT), **node_labels(nodes)}
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


@dataclass(frozen=True, slots=True)
class TargetEntry:
    """A pod of the node, and the policies of its namespace that select it."""

    pod: PodKey
    uid: str
    policies: tuple[str, ...]  # policy names, sorted

    def policy_keys(self) -> tuple[PolicyKey, ...]:
        return tuple((self.pod[0], name) for name in self.policies)


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


# -- reading (the agent, and the controller's view of what it wrote) -------------------


class _Fields:
    """Reads a published object's fields; errors name the object and the field."""

    def __init__(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.kind = str(obj.get("kind", "?"))
        self.name = str(meta.get("name") or "?")
        self.what = f"{self.kind} {self.name}"
        self.meta = meta

    def fail(self, path: str, value: object, problem: str) -> PolicyInputError:
        return PolicyInputError(self.what, path, value, problem)

    def get(self, spec: Mapping[str, Any], field: str, kind: type, path: str = "spec") -> Any:
        value = spec.get(field, MISSING)
        if value is MISSING:
            raise self.fail(f"{path}.{field}", MISSING, "is required")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"{path}.{field}", value, f"must be of type {kind.__name__}")
        return value

    def pod_key(self, value: object, path: str) -> PodKey:
        if not isinstance(value, str) or value.count("/") != 1:
            raise self.fail(path, value, "must be NAMESPACE/NAME")
        namespace, name = value.split("/")
        return sys.intern(namespace), name


def _foreign(fields: _Fields, info: ShardInfo) -> str:
    """Why the object is not one the controller wrote as it is ("": it is)."""
    labels = fields.meta.get("labels") or {}
    for key, value in MANAGED_BY.items():
        if labels.get(key) != value:
            return f"it lacks the label {key}={value}"
    if fields.name != info.derived_name:
        return f"its name is not {info.derived_name}, the one its spec derives"
    if info.kind == POLICY_ENDPOINTS and not info.version[0]:
        return "it names no policy uid"
    return ""


def shard_info(obj: Mapping[str, Any], controller: bool = True) -> ShardInfo:
    """What an object of any of the three kinds says about itself, and whether the
    controller wrote it (``foreign``), with what the controller compares: a digest of
    its spec (it never keeps the content) and its labels, as an interned label set (a
    set's shards carry a label per node, the same hundred names on every object). An
    agent (``controller=False``) compares neither: it gets no digest and no labels,
    which spares it hashing every shard it receives."""
    fields = _Fields(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise fields.fail("spec", spec, "must be an object")
    index = fields.get(spec, "shardIndex", int)
    count = fields.get(spec, "shardCount", int)
    if not 0 <= index < count:
        raise fields.fail("spec.shardIndex", index, f"is not below shardCount {count}")
    set_namespace = ""
    if fields.kind == POLICY_ENDPOINTS:
        set_namespace = fields.get(spec, "policyNamespace", str)
        set_name = fields.get(spec, "policyName", str)
        version: tuple[str, ...] = (
            fields.get(spec, "policyUID", str),
            str(fields.get(spec, "policyGeneration", int)),
        )
    elif fields.kind == ADDRESS_SET:
        set_name, version = fields.get(spec, "setID", str), ()
    elif fields.kind == POLICY_TARGETS:
        set_name, version = fields.get(spec, "nodeName", str), ()
    else:
        raise fields.fail("kind", fields.kind, f"is not one of {', '.join(PLURALS)}")
    labels = fields.meta.get("labels") or {}
    info = INFO_TYPES[fields.kind](
        kind=fields.kind,
        name=fields.name,
        set_namespace=set_namespace,
        set_name=set_name,
        version=version,
        index=index,
        count=count,
        labels=labels_of((str(k), str(v)) for k, v in labels.items()) if controller else NO_LABELS,
        resource_version=str(fields.meta.get("resourceVersion") or ""),
        content=spec_hash(spec) if controller else "",
    )
    foreign = _foreign(fields, info)
    return replace(info, foreign=foreign) if foreign else info


def written_by_controller(obj: Mapping[str, Any]) -> ShardInfo:
    """An agent's reading of an object's identity: PolicyInputError unless the
    controller wrote it (see the module's docstring)."""
    info = shard_info(obj, controller=False)
    if info.foreign:
        raise PolicyInputError(
            f"{info.kind} {info.name}", "", MISSING, f"is not the controller's: {info.foreign}"
        )
    return info


@dataclass(frozen=True, slots=True)
class PolicyShard:
    info: ShardInfo
    policy: NetworkPolicy
    address_sets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddressShard:
    info: ShardInfo
    pods: tuple[Pod, ...]


@dataclass(frozen=True, slots=True)
class TargetsShard:
    info: ShardInfo
    entries: tuple[TargetEntry, ...]


PublishedShard = PolicyShard | AddressShard | TargetsShard


def parse_policy_endpoints(obj: Mapping[str, Any]) -> PolicyShard:
    info = written_by_controller(obj)
    fields = _Fields(obj)
    spec = obj["spec"]
    rules = fields.get(spec, "policy", dict)
    try:
        policy = parse_network_policy(
            {"metadata": {"namespace": info.set_namespace, "name": info.set_name}, "spec": rules},
            published=True,
        )
    except PolicyInputError as err:
        raise err.within(f"{fields.what} spec.policy") from None
    sets = fields.get(spec, "addressSets", list)
    for i, name in enumerate(sets):
        if not isinstance(name, str):
            raise fields.fail(f"spec.addressSets[{i}]", name, "must be a string")
    return PolicyShard(info, policy, tuple(sets))


def parse_address_set(obj: Mapping[str, Any]) -> AddressShard:
    info = written_by_controller(obj)
    fields = _Fields(obj)
    pods = []
    for i, entry in enumerate(fields.get(obj["spec"], "pods", list)):
        at = f"spec.pods[{i}]"
        if not isinstance(entry, Mapping):
            raise fields.fail(at, entry, "must be an object")
        namespace, name = fields.pod_key(entry.get("pod"), f"{at}.pod")
        ips = fields.get(entry, "ips", list, at)
        if not all(isinstance(ip, str) for ip in ips):
            raise fields.fail(f"{at}.ips", ips, "must be a list of strings")
        ports = []
        for j, port in enumerate(entry.get("ports") or ()):
            where = f"{at}.ports[{j}]"
            if not isinstance(port, Mapping):
                raise fields.fail(where, port, "must be an object")
            ports.append(
                ContainerPort(
                    sys.intern(fields.get(port, "name", str, where)),
                    fields.get(port, "port", int, where),
                    sys.intern(fields.get(port, "protocol", str, where)),
                )
            )
        pods.append(_shared_pod(namespace, name, tuple(ips), tuple(ports)))
    return AddressShard(info, tuple(pods))


# One Pod object per distinct address-set entry, for as long as some shard holds it.
# A pod is listed in every set whose selector picks it (about six on average in the
# scale benchmark's cluster): an agent would otherwise hold as many copies.
_address_pods: weakref.WeakValueDictionary[
    tuple[str, str, tuple[str, ...], tuple[ContainerPort, ...]], Pod
] = weakref.WeakValueDictionary()


def _shared_pod(
    namespace: str, name: str, ips: tuple[str, ...], ports: tuple[ContainerPort, ...]
) -> Pod:
    key = (namespace, name, ips, ports)
    pod = _address_pods.get(key)
    if pod is None:
        pod = Pod(namespace=namespace, name=name, ips=ips, ports=ports)
        pod = _address_pods.setdefault(key, pod)
    return pod


def parse_policy_targets(obj: Mapping[str, Any]) -> TargetsShard:
    info = written_by_controller(obj)
    fields = _Fields(obj)
    entries = []
    for i, entry in enumerate(fields.get(obj["spec"], "pods", list)):
        at = f"spec.pods[{i}]"
        if not isinstance(entry, Mapping):
            raise fields.fail(at, entry, "must be an object")
        key = fields.pod_key(entry.get("pod"), f"{at}.pod")
        policies = fields.get(entry, "policies", list, at)
        if not all(isinstance(p, str) for p in policies):
            raise fields.fail(f"{at}.policies", policies, "must be a list of strings")
        entries.append(
            TargetEntry(key, str(entry.get("uid") or ""), tuple(sys.intern(p) for p in policies))
        )
    return TargetsShard(info, tuple(entries))
