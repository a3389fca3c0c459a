"""The published objects' contents as an agent reads them: one ``PolicyShard``,
``AddressShard`` or ``TargetsShard`` per object, read only when the controller
wrote it (``identity.written_by_controller``); a ``TargetEntry`` is one pod of a
PolicyTargets, as the controller writes it too.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.policy.errors import PolicyInputError
from cni.policy.model import ContainerPort, NetworkPolicy, Pod, PodKey, PolicyKey
from cni.policy.parse_policy import parse_network_policy
from cni.policy.published.identity import PublishedFields, ShardInfo, written_by_controller


@dataclass(frozen=True, slots=True)
class TargetEntry:
    """A pod of the node, and the policies of its namespace that select it."""

    pod: PodKey
    uid: str
    policies: tuple[str, ...]  # policy names, sorted

    def policy_keys(self) -> tuple[PolicyKey, ...]:
        return tuple((self.pod[0], name) for name in self.policies)


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
    fields = PublishedFields(obj)
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
    fields = PublishedFields(obj)
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
    fields = PublishedFields(obj)
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
