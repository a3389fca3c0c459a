"""What a published object says about itself (``ShardInfo``), and whether the
controller wrote it.

Every object is one shard of a set and says so: ``shardIndex``, ``shardCount``,
and what makes the set's shards belong together (the policy's uid and
generation; the address set's id; the node). A set is complete when shards
``0..shardCount-1`` are all present and agree on that (see ``shardsets``).

Only the controller's objects count (``written_by_controller``): an object is
read only when its name is the one its spec derives (so that two objects can
never claim one shard: the API server keeps names unique), it carries the
managed-by label, and a PolicyEndpoints names its policy's uid. Agents drop any
other object; the controller deletes it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.model import NO_LABELS, PodKey, labels_of
from cni.policy.published.names import (
    ADDRESS_SET,
    MANAGED_BY,
    PLURALS,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    address_set_name,
    policy_endpoints_name,
    policy_targets_name,
    spec_hash,
)


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


class PublishedFields:
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


def _foreign(fields: PublishedFields, info: ShardInfo) -> str:
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
    fields = PublishedFields(obj)
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
