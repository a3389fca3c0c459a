"""The objects the resolver knows, by kind and name, with the lookups it needs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from cni.policy.model import (
    DIRECTIONS,
    NAMESPACE_NAME_LABEL,
    Labels,
    Namespace,
    NetworkPolicy,
    Pod,
    PodKey,
    PolicyKey,
    Service,
    ServiceKey,
    labels_of,
)

log = logging.getLogger("sluice.policy")


class ObjectStore:
    """Namespaces, pods, policies and services; no derived state.

    Pods and policies are kept per namespace (a pod is found by namespace,
    then name), because every selector starts from a namespace.
    """

    def __init__(self) -> None:
        self.namespaces: dict[str, Namespace] = {}
        self._pods: dict[str, dict[str, Pod]] = {}
        self.policies: dict[PolicyKey, NetworkPolicy] = {}
        self._policies_by_namespace: dict[str, set[PolicyKey]] = {}
        self.services: dict[ServiceKey, Service] = {}
        self.refused: set[PolicyKey] = set()  # policies sluice could not read whole
        self._claims: dict[str, set[PodKey]] = {}  # address -> the pods that have it

    # Namespaces. One that has pods but no Namespace object (a manifest that
    # never declared it) exists too, with only the name label the API server
    # would have given it.

    def namespace_exists(self, name: str) -> bool:
        return name in self.namespaces or name in self._pods

    def namespace_names(self) -> set[str]:
        return set(self.namespaces) | set(self._pods)

    def namespace_labels(self, name: str) -> Labels:
        namespace = self.namespaces.get(name)
        if namespace is not None:
            return namespace.labels
        return labels_of({NAMESPACE_NAME_LABEL: name})

    # Pods.

    def pod(self, key: PodKey) -> Pod | None:
        return self._pods.get(key[0], {}).get(key[1])

    def pods_in(self, namespace: str) -> Iterator[Pod]:
        yield from self._pods.get(namespace, {}).values()

    def all_pods(self) -> Iterator[Pod]:
        for pods in self._pods.values():
            yield from pods.values()

    def put_pod(self, pod: Pod) -> None:
        pods = self._pods.setdefault(pod.namespace, {})
        old = pods.get(pod.name)
        pods[pod.name] = pod
        if old is None or old.ips != pod.ips:
            self._unclaim(old)
            for ip in pod.ips:
                self._claims.setdefault(ip, set()).add(pod.key)

    def remove_pod(self, key: PodKey) -> Pod | None:
        pods = self._pods.get(key[0])
        if pods is None:
            return None
        pod = pods.pop(key[1], None)
        if not pods:
            del self._pods[key[0]]
        self._unclaim(pod)
        return pod

    def claimants(self, ip: str) -> set[PodKey]:
        """The pods whose addresses include ``ip`` (more than one while the API still
        reports a gone pod's address that a new pod was given)."""
        return self._claims.get(ip, set())

    def _unclaim(self, pod: Pod | None) -> None:
        if pod is None:
            return
        for ip in pod.ips:
            holders = self._claims[ip]
            holders.discard(pod.key)
            if not holders:
                del self._claims[ip]

    # Policies.

    def policies_in(self, namespace: str) -> set[PolicyKey]:
        return self._policies_by_namespace.get(namespace, set())

    def put_policy(self, policy: NetworkPolicy) -> None:
        old = self.policies.get(policy.key)
        self.policies[policy.key] = policy
        self._policies_by_namespace.setdefault(policy.namespace, set()).add(policy.key)
        # Every resolver and the controller take policies in here: a refusal is
        # reported once, when it appears or changes.
        if policy.refused:
            self.refused.add(policy.key)
            if old is None or old.refusals != policy.refusals:
                log.error(
                    "NetworkPolicy %s/%s is refused, in part: %s; it isolates the pods it "
                    "selects for %s, and what sluice cannot read allows nothing",
                    policy.namespace,
                    policy.name,
                    "; ".join(policy.refusals),
                    " and ".join(d for d in DIRECTIONS if policy.isolates(d)) or "nothing",
                )
        elif policy.key in self.refused:
            self.refused.discard(policy.key)
            log.info("NetworkPolicy %s/%s is read whole again", policy.namespace, policy.name)

    def remove_policy(self, key: PolicyKey) -> NetworkPolicy | None:
        policy = self.policies.pop(key, None)
        self.refused.discard(key)
        if policy is not None:
            keys = self._policies_by_namespace[key[0]]
            keys.discard(key)
            if not keys:
                del self._policies_by_namespace[key[0]]
        return policy
