"""NetworkPolicy verdicts read from the specification alone: the oracle that sequence
tests compare sluice with.

It is written from the networking.k8s.io/v1 API reference and the e2e suite's
conventions, on the objects as the API server returns them (plain JSON dicts), and
imports nothing of ``cni``: a defect in sluice's resolver cannot hide in it.

    state = ClusterState()
    state.namespaces["x"] = {"ns": "x", "kubernetes.io/metadata.name": "x"}
    state.pods[("x", "a")] = OraclePod("x", "a", {"pod": "a"}, "10.244.0.5", PORTS)
    state.policies[("x", "deny")] = {"podSelector": {}, "policyTypes": ["Ingress"]}
    state.allowed(("x", "b"), ("x", "a"), 80, "tcp")   # False

Semantics, as the specification states them:
- a pod is isolated for a direction when a policy of its own namespace selects it
  (``podSelector``) and lists that direction in ``policyTypes``; without
  ``policyTypes``, Ingress is always listed and Egress when ``egress`` has a rule;
- an isolated pod admits, in that direction, exactly the union of the rules of the
  policies that isolate it; a rule matches when one of its peers matches (no ``from``
  or ``to``, or an empty list: every peer) and one of its ports matches (no
  ``ports``, or an empty list: every port and protocol);
- a peer: ``podSelector`` alone selects pods of the policy's namespace,
  ``namespaceSelector`` alone every pod of the selected namespaces, both together the
  selected pods of the selected namespaces; ``ipBlock`` matches addresses inside
  ``cidr`` and outside every ``except``, pod addresses included;
- a port: ``protocol`` (TCP when absent) and ``port`` (absent: every port), a
  number up to ``endPort`` or a name, which is the destination pod's container
  port of that name and protocol (in both directions the destination pod is the one
  receiving the connection);
- a connection between two pods needs the source's egress and the destination's
  ingress; a pod always reaches itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PodRef = tuple[str, str]  # (namespace, name)
PolicyRef = tuple[str, str]


@dataclass(frozen=True)
class ContainerPortSpec:
    name: str  # "" for an unnamed port
    port: int
    protocol: str  # "TCP", "UDP", "SCTP"


@dataclass(frozen=True)
class OraclePod:
    namespace: str
    name: str
    labels: Mapping[str, str]
    ip: str
    ports: tuple[ContainerPortSpec, ...] = ()
    # An address no selector picks (a pod the judge does not know as one yet): only
    # ipBlocks and rules without peers match it, and no policy selects it.
    external: bool = False

    @property
    def ref(self) -> PodRef:
        return (self.namespace, self.name)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpression holds
    (an empty selector matches everything)."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression["key"], expression["operator"]
        values = set(expression.get("values") or ())
        if operator == "In":
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"unknown selector operator {operator!r}")
        if not ok:
            return False
    return True


def policy_types(spec: Mapping[str, Any]) -> set[str]:
    types = spec.get("policyTypes")
    if types:
        return set(types)
    return {"Ingress", "Egress"} if spec.get("egress") else {"Ingress"}


def _in_block(ip: str, block: Mapping[str, Any]) -> bool:
    address = ipaddress.ip_address(ip)
    network = ipaddress.ip_network(block["cidr"], strict=False)
    if address.version != network.version or address not in network:
        return False
    for excepted in block.get("except") or ():
        network = ipaddress.ip_network(excepted, strict=False)
        if address.version == network.version and address in network:
            return False
    return True


@dataclass
class ClusterState:
    """Namespaces (name -> labels), pods, and policies (key -> the policy's spec)."""

    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[PodRef, OraclePod] = field(default_factory=dict)
    policies: dict[PolicyRef, Mapping[str, Any]] = field(default_factory=dict)

    def copy(self) -> ClusterState:
        return ClusterState(
            {name: dict(labels) for name, labels in self.namespaces.items()},
            dict(self.pods),
            dict(self.policies),
        )

    # -- one peer, one port --------------------------------------------------------------

    def _peer_matches(
        self, policy_namespace: str, peer: Mapping[str, Any], other: OraclePod
    ) -> bool:
        if "ipBlock" in peer and peer["ipBlock"] is not None:
            return _in_block(other.ip, peer["ipBlock"])
        if other.external:
            return False
        pod_selector = peer.get("podSelector")
        namespace_selector = peer.get("namespaceSelector")
        if pod_selector is None and namespace_selector is None:
            raise ValueError(f"a peer without selector or ipBlock: {peer!r}")
        if namespace_selector is None:
            if other.namespace != policy_namespace:
                return False
        elif not selector_matches(namespace_selector, self.namespaces.get(other.namespace, {})):
            return False
        return selector_matches(pod_selector, other.labels)

    @staticmethod
    def _port_matches(
        rule_port: Mapping[str, Any], destination: OraclePod, port: int, protocol: str
    ) -> bool:
        wanted = (rule_port.get("protocol") or "TCP").upper()
        if wanted != protocol.upper():
            return False
        number = rule_port.get("port")
        if number is None:
            return True
        if isinstance(number, str):
            return any(
                cp.name == number and cp.protocol == wanted and cp.port == port
                for cp in destination.ports
            )
        end = rule_port.get("endPort") or number
        return number <= port <= end

    def _rule_matches(
        self,
        policy_namespace: str,
        rule: Mapping[str, Any],
        peers_field: str,
        other: OraclePod,
        destination: OraclePod,
        port: int,
        protocol: str,
    ) -> bool:
        peers = rule.get(peers_field) or ()
        if peers and not any(self._peer_matches(policy_namespace, p, other) for p in peers):
            return False
        ports = rule.get("ports") or ()
        return not ports or any(self._port_matches(p, destination, port, protocol) for p in ports)

    # -- verdicts ------------------------------------------------------------------------

    def isolating(self, pod: OraclePod, direction: str) -> list[PolicyRef]:
        """The policies that isolate the pod for ``direction`` ("Ingress"/"Egress")."""
        if pod.external:
            return []
        return sorted(
            key
            for key, spec in self.policies.items()
            if key[0] == pod.namespace
            and direction in policy_types(spec)
            and selector_matches(spec.get("podSelector") or {}, pod.labels)
        )

    def direction_allows(
        self, pod: OraclePod, direction: str, other: OraclePod, destination: OraclePod,
        port: int, protocol: str,
    ) -> bool:  # fmt: skip
        isolating = self.isolating(pod, direction)
        if not isolating:
            return True
        rules_field, peers_field = (
            ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        )
        return any(
            self._rule_matches(key[0], rule, peers_field, other, destination, port, protocol)
            for key in isolating
            for rule in self.policies[key].get(rules_field) or ()
        )

    def allowed(self, source: PodRef, destination: PodRef, port: int, protocol: str) -> bool:
        """Whether ``source`` may open a connection to ``destination``'s port."""
        if source == destination:
            return True
        src, dst = self.pods[source], self.pods[destination]
        return self.direction_allows(
            src, "Egress", dst, dst, port, protocol
        ) and self.direction_allows(dst, "Ingress", src, dst, port, protocol)

    def table(
        self, served: Iterable[tuple[int, str]], pods: Iterable[PodRef] | None = None
    ) -> dict[tuple[PodRef, PodRef, int, str], bool]:
        """Every ordered pair of distinct pods on every served (port, protocol)."""
        refs = sorted(self.pods if pods is None else pods)
        served = list(served)
        return {
            (s, d, port, protocol): self.allowed(s, d, port, protocol)
            for s in refs
            for d in refs
            if s != d
            for port, protocol in served
        }
