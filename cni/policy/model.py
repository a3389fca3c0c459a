"""The Kubernetes objects the resolver reads, cut down to the fields it reads.

Everything is frozen and slotted: an agent holds every pod of the cluster
(10,000 and more), so a pod is a handful of references. Labels are a
frozenset of (key, value) pairs, interned: the replicas of a workload share
one label set, and ``match_labels <= labels`` is a single C-level subset test.

Protocols are spelled as Kubernetes spells them (``TCP``, ``UDP``, ``SCTP``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

Labels: TypeAlias = frozenset[tuple[str, str]]
PodKey: TypeAlias = tuple[str, str]  # (namespace, name)
PolicyKey: TypeAlias = tuple[str, str]  # (namespace, name)
ServiceKey: TypeAlias = tuple[str, str]  # (namespace, name)
Direction: TypeAlias = Literal["ingress", "egress"]

DIRECTIONS: tuple[Direction, Direction] = ("ingress", "egress")
PROTOCOLS = ("TCP", "UDP", "SCTP")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

NO_LABELS: Labels = frozenset()

# One instance per distinct label set, for as long as some object holds it. The
# key is a separate sorted tuple: a set that were its own key would never die.
_label_sets: weakref.WeakValueDictionary[tuple[tuple[str, str], ...], Labels] = (
    weakref.WeakValueDictionary()
)


def labels_of(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """The shared, interned label set holding ``pairs``."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    labels = frozenset((sys.intern(k), sys.intern(v)) for k, v in items)
    if not labels:
        return NO_LABELS
    return _label_sets.setdefault(tuple(sorted(labels)), labels)


def label_dict(labels: Labels) -> dict[str, str]:
    """Labels as a sorted dict, for display."""
    return dict(sorted(labels))


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    labels: Labels = NO_LABELS


@dataclass(frozen=True, slots=True)
class ContainerPort:
    name: str  # "" when the port has no name
    port: int
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Pod:
    namespace: str
    name: str
    labels: Labels = NO_LABELS
    ips: tuple[str, ...] = ()  # none yet (a local pod before ADD), or none any more
    node_name: str = ""
    ports: tuple[ContainerPort, ...] = ()
    host_network: bool = False
    # The API's uid ("" from a manifest): tells a pod from an earlier one of the same name,
    # which the controller's per-node targets (cni/k8s) must not be mistaken for.
    uid: str = ""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str  # one of OPERATORS
    values: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A selector in canonical form (expressions sorted), so equal selectors are equal keys."""

    match_labels: Labels = NO_LABELS
    match_expressions: tuple[Requirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


EVERYTHING = LabelSelector()  # the empty selector: matches every object


@dataclass(frozen=True, slots=True)
class IPBlock:
    cidr: str
    excepts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Peer:
    """One ``from``/``to`` entry. A missing selector (None) differs from an empty one."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None


@dataclass(frozen=True, slots=True)
class PolicyPort:
    """One ``ports`` entry: ``port`` None is every port of the protocol, a str a named port."""

    protocol: str = "TCP"
    port: int | str | None = None
    end_port: int | None = None


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """An ingress or egress rule: no peers means every peer, no ports every port and protocol.

    ``refused`` (not ""): the API server accepted the rule but sluice cannot read it
    (why); it allows nothing, and its policy still isolates what it selects."""

    peers: tuple[Peer, ...] = ()
    ports: tuple[PolicyPort, ...] = ()
    refused: str = ""


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: LabelSelector = EVERYTHING
    policy_types: tuple[str, ...] = ()  # as written; () applies Kubernetes' defaults
    ingress: tuple[PolicyRule, ...] = ()
    egress: tuple[PolicyRule, ...] = ()
    # What sluice could not read of a policy the API server accepted (field: why), each
    # read the safe way: an unreadable rule allows nothing, an unreadable podSelector
    # selects every pod of the namespace, unreadable policyTypes isolate both directions.
    refusals: tuple[str, ...] = ()

    @property
    def key(self) -> PolicyKey:
        return (self.namespace, self.name)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def isolates(self, direction: Direction) -> bool:
        """Whether the pods this policy selects are isolated in ``direction``.

        Without policyTypes, as the API server defaults them: Ingress always,
        Egress only when the policy has egress rules.
        """
        if self.policy_types:
            return direction.capitalize() in self.policy_types
        return direction == "ingress" or bool(self.egress)

    def rules(self, direction: Direction) -> tuple[PolicyRule, ...]:
        return self.ingress if direction == "ingress" else self.egress


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    target_port: int | str  # a number, or a container port name
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    cluster_ips: tuple[str, ...] = ()  # without "None" (headless)
    selector: Labels | None = None  # None: no selector (endpoints managed by hand)
    ports: tuple[ServicePort, ...] = ()

    @property
    def key(self) -> ServiceKey:
        return (self.namespace, self.name)


KubeObject: TypeAlias = Namespace | Pod | NetworkPolicy | Service
