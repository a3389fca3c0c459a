"""Resolving a pod's policy: what every resolver answers (``ResolvedPolicy``), the
protocol the resolvers share (``PodPolicyResolver``), and how the policies that
select a pod combine (``resolve_pod``). The resolvers are ``cni.policy.index``'s
``PolicyIndex`` (Kubernetes objects in) and ``cni.policy.published.index``'s
``ShardIndex`` (a controller's published objects in).

Semantics (networking.k8s.io/v1, as Kubernetes and its e2e suite have them):
- a pod is isolated in a direction when some policy of its namespace selects
  it and isolates that direction (policyTypes, or their defaults: Ingress
  always, Egress when the policy has egress rules); it is then allowed the
  union of those policies' rules in that direction, and nothing else;
  no rules at all is deny all;
- a direction no policy isolates is not isolated (``None``): everything passes;
- a pod may always reach itself: traffic to its own address never leaves its
  namespace, so no rule is needed (``explain`` names it all the same), and
  pods selected by the same policies get equal rule sets, compiled once;
- hostNetwork pods are no policy targets (they have no endpoint); as peers
  they are their addresses (the node's), like any other address;
- pods without an address are no peers;
- traffic from the node to its pods is the datapath's business
  (``deny_node`` stays False);
- Services are not resolved into rules: the datapath judges a connection to
  a ClusterIP after kube-proxy's DNAT, on the backend pod's address and
  target port. ``service_ips`` gives it the ClusterIPs to recognise.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cni.policy.errors import PolicyIncomplete
from cni.policy.kinds import ByKind, KindHandlers
from cni.policy.model import Direction, NetworkPolicy, Pod, PodKey, PolicyKey
from cni.policy.ownership import held_by_another
from cni.policy.rules import CompiledPolicy, RuleOrigin
from cni.policy.store import ObjectStore
from cni.policy.vocabulary import AllowRule, EndpointPolicy


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A pod's policy for the datapath, and where each of its allow rules came from.

    ``ingress_origins[i]`` explains ``endpoint.ingress[i]`` (likewise egress);
    ``ingress_policies`` are the policies that isolate the pod for ingress.
    """

    pod: PodKey
    endpoint: EndpointPolicy
    ingress_origins: tuple[RuleOrigin, ...] = ()
    egress_origins: tuple[RuleOrigin, ...] = ()
    ingress_policies: tuple[PolicyKey, ...] = ()
    egress_policies: tuple[PolicyKey, ...] = ()

    def rules(self, direction: Direction) -> tuple[AllowRule, ...] | None:
        return self.endpoint.ingress if direction == "ingress" else self.endpoint.egress

    def origins(self, direction: Direction) -> tuple[RuleOrigin, ...]:
        return self.ingress_origins if direction == "ingress" else self.egress_origins

    def policies(self, direction: Direction) -> tuple[PolicyKey, ...]:
        return self.ingress_policies if direction == "ingress" else self.egress_policies

    @property
    def selected_by(self) -> tuple[PolicyKey, ...]:
        return tuple(sorted({*self.ingress_policies, *self.egress_policies}))


# What a resolver is fed: Kubernetes objects (PolicyIndex), or the local ones and the
# controller's published shards (ShardIndex).
Fed = TypeVar("Fed")


class PodPolicyResolver(ABC, Generic[Fed]):
    """A resolver as the agent's enforcer uses it: ``PolicyIndex`` (everything known
    locally), or ``cni.policy.published.index.ShardIndex`` (a controller's published
    groups). Both take objects by kind (``kinds``) and answer ``resolve`` the same way:
    a pod's policies, each compiled once, combined by ``resolve_pod``; results for the
    local pods cached until an update names them."""

    def __init__(self) -> None:
        self.store = ObjectStore()  # local pods, Services, and the policies known
        self._resolved: dict[PodKey, ResolvedPolicy] = {}

    @functools.cached_property
    def kinds(self) -> ByKind[frozenset[PodKey]]:
        """The kinds this resolver takes (built once the subclass's state exists)."""
        return ByKind(self._handlers(), _union, type(self).__name__)

    @abstractmethod
    def _handlers(self) -> dict[type, KindHandlers[frozenset[PodKey]]]:
        """What to do with each kind of object."""

    # Updates: each returns the local pods whose policy may have changed.

    def upsert(self, obj: Fed) -> frozenset[PodKey]:
        return self.kinds.upsert(obj)

    def delete(self, obj: Fed) -> frozenset[PodKey]:
        """Remove the object of that kind and name (its other fields do not matter)."""
        return self.kinds.delete(obj)

    def replace_all(self, kind: type[Fed], objects: Iterable[Fed]) -> frozenset[PodKey]:
        """Make the objects of ``kind`` exactly ``objects`` (after a relist, or when a
        store is loaded again)."""
        return self.kinds.replace_all(kind, objects)

    @abstractmethod
    def upsert_pod(self, pod: Pod) -> frozenset[PodKey]: ...

    @abstractmethod
    def rebuilt(self) -> PodPolicyResolver[Fed]:
        """A fresh resolver of the same kind fed what this one holds."""

    @abstractmethod
    def delete_pod(self, key: PodKey) -> frozenset[PodKey]: ...

    # Reading.

    def pod(self, key: PodKey) -> Pod | None:
        return self.store.pod(key)

    def policy(self, key: PolicyKey) -> NetworkPolicy | None:
        return self.store.policies.get(key)

    @abstractmethod
    def selecting_policies(self, pod: Pod) -> list[PolicyKey]:
        """The policies that select the pod, by key."""

    @abstractmethod
    def compiled(self, key: PolicyKey) -> CompiledPolicy:
        """The policy's rules, compiled once until its inputs change."""

    @abstractmethod
    def incomplete(self, key: PodKey) -> str | None:
        """Why the pod's policy cannot be computed yet, or None."""

    def caches(self, key: PodKey) -> bool:
        """Whether the pod's result is kept until an update names it (local pods)."""
        return True

    def address_held(self, key: PodKey, ips: Iterable[str]) -> str | None:
        """Why a new endpoint of pod ``key`` with these addresses must wait
        (``cni.policy.ownership.held_by_another``); None: the addresses are free."""
        return held_by_another(self.store, key, ips)

    def resolve(self, key: PodKey) -> ResolvedPolicy:
        """The pod's EndpointPolicy with provenance. KeyError for an unknown pod,
        PolicyIncomplete while the resolver lacks some of its inputs."""
        cached = self._resolved.get(key)
        if cached is not None:
            return cached
        pod = self.store.pod(key)
        if pod is None:
            raise KeyError(f"unknown pod {key[0]}/{key[1]}")
        missing = self.incomplete(key)
        if missing is not None:
            raise PolicyIncomplete(missing)
        resolved = resolve_pod(
            pod, self.selecting_policies(pod), self.store.policies.__getitem__, self.compiled
        )
        if self.caches(key):
            self._resolved[key] = resolved
        return resolved

    def _invalidate(self, affected: set[PodKey]) -> frozenset[PodKey]:
        for key in affected:
            self._resolved.pop(key, None)
        return frozenset(affected)


def _union(results: Iterable[frozenset[PodKey]]) -> frozenset[PodKey]:
    return frozenset().union(*results)


def resolve_pod(
    pod: Pod,
    selecting: Iterable[PolicyKey],
    policy_of: Callable[[PolicyKey], NetworkPolicy],
    compiled_of: Callable[[PolicyKey], CompiledPolicy],
) -> ResolvedPolicy:
    """A pod's policy from the policies that select it (in key order) and their compiled
    rules: the one place that says how policies combine, whoever compiled them (this
    index, or an agent from a controller's published groups)."""
    selecting = list(selecting)
    ingress, ingress_origins, ingress_policies = _direction(
        pod, selecting, policy_of, compiled_of, "ingress"
    )
    egress, egress_origins, egress_policies = _direction(
        pod, selecting, policy_of, compiled_of, "egress"
    )
    return ResolvedPolicy(
        pod=pod.key,
        endpoint=EndpointPolicy(ingress=ingress, egress=egress),
        ingress_origins=ingress_origins,
        egress_origins=egress_origins,
        ingress_policies=ingress_policies,
        egress_policies=egress_policies,
    )


def _direction(
    pod: Pod,
    selecting: list[PolicyKey],
    policy_of: Callable[[PolicyKey], NetworkPolicy],
    compiled_of: Callable[[PolicyKey], CompiledPolicy],
    direction: Direction,
) -> tuple[tuple[AllowRule, ...] | None, tuple[RuleOrigin, ...], tuple[PolicyKey, ...]]:
    """(rules or None when not isolated, their origins, the isolating policies)."""
    isolating = tuple(key for key in selecting if policy_of(key).isolates(direction))
    if not isolating:
        return None, (), ()
    rules: list[AllowRule] = []
    origins: list[RuleOrigin] = []
    for policy_key in isolating:
        for compiled in compiled_of(policy_key).rules(direction) or ():
            allows = compiled.for_target(pod)
            rules.extend(allows)
            origins.extend([compiled.origin] * len(allows))
    return tuple(rules), tuple(origins), isolating


def service_ips(index: PodPolicyResolver[Any]) -> frozenset[str]:
    """Every ClusterIP of every Service (headless ones have none)."""
    return frozenset(ip for service in index.store.services.values() for ip in service.cluster_ips)
