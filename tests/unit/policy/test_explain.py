"""explain and verdict: readable, and in agreement with the datapath's compiled tables."""

from __future__ import annotations

import ipaddress
import json
import random

import pytest

from cni.datapath.ruleset import CompiledDirection, compile_direction
from cni.datapath.structs import RULE_ANY_PORT
from cni.policy.explain import explain, verdict
from cni.policy.resolve import service_ips
from cni.policy.vocabulary import AllowRule, Ports
from tests.unit.policy import random_cluster
from tests.unit.policy.cluster import apply, cluster, policy

X_A = ("x", "a")
PROTOCOL_NUMBERS = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1}

POLICIES = (
    policy(
        "x",
        "web",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]
      ports: [{port: serve-80-tcp}, {protocol: UDP, port: 5000, endPort: 5010}]
    - from: [{ipBlock: {cidr: 192.168.0.0/16, except: [192.168.1.0/24]}}]""",
    ),
    policy("x", "deny-egress", "  podSelector: {}\n  policyTypes: [Egress]"),
)


def test_explain_names_policies_pods_cidrs_and_ports() -> None:
    index = cluster(*POLICIES)
    explanation = explain(index, X_A)
    assert explanation.selected_by == (("x", "deny-egress"), ("x", "web"))
    assert explanation.to_text() == (
        "pod x/a (10.1.0.1)\n"
        "ingress: isolated by x/web; may receive only:\n"
        "  from itself on any port and protocol  [the pod's own address]\n"
        "  from y/b on UDP 5000-5010, TCP 80  [x/web ingress rule 0]\n"
        "  from 192.168.0.0/16 except 192.168.1.0/24 on any port and protocol"
        "  [x/web ingress rule 1]\n"
        "egress: isolated by x/deny-egress; may send only:\n"
        "  to itself on any port and protocol  [the pod's own address]"
    )
    data = explanation.to_dict()
    json.dumps(data)  # plain data
    assert data["ingress"]["policies"] == ["x/web"]
    assert data["ingress"]["allows"][1] == {
        "by": "x/web ingress rule 0",
        "policy": "x/web",
        "rule": 0,
        "peers": ["y/b"],
        "ports": ["UDP 5000-5010", "TCP 80"],
    }
    assert data["egress"]["isolated"] is True


def test_explain_unselected_pod() -> None:
    index = cluster(*POLICIES)
    text = explain(index, ("y", "a")).to_text()
    assert text == (
        "pod y/a (10.2.0.1)\n"
        "ingress: not isolated, may receive anything\n"
        "egress: not isolated, may send anything"
    )


def test_verdict_reasons() -> None:
    index = cluster(*POLICIES)
    allowed = verdict(index, X_A, "ingress", "10.2.0.2", 80, "TCP")
    assert (allowed.allowed, allowed.policy, allowed.rule_index) == (True, ("x", "web"), 0)
    assert allowed.reason == "allowed by x/web ingress rule 0"
    by_block = verdict(index, X_A, "ingress", "192.168.7.7", 22, "TCP")
    assert (by_block.allowed, by_block.rule_index) == (True, 1)
    excepted = verdict(index, X_A, "ingress", "192.168.1.7", 22, "TCP")
    assert not excepted.allowed
    assert excepted.reason == "isolated by policies [x/web]; no rule allows it"
    itself = verdict(index, X_A, "egress", "10.1.0.1", 443, "TCP")
    assert itself.allowed and itself.reason == "a pod may always reach itself"
    assert verdict(index, ("y", "a"), "ingress", "1.2.3.4", 1, "UDP").reason == (
        "not isolated: default allow"
    )
    ipv6 = verdict(index, X_A, "ingress", "fd00::1", 80, "TCP")
    assert not ipv6.allowed and "IPv6 is dropped" in ipv6.reason
    assert verdict(index, X_A, "egress", "10.2.0.2", 80, "TCP").to_dict() == {
        "allowed": False,
        "reason": "isolated by policies [x/deny-egress]; no rule allows it",
        "policy": None,
        "rule": None,
    }


def test_service_ips() -> None:
    index = cluster()
    apply(
        index,
        """
kind: Service
metadata: {name: web, namespace: x}
spec: {clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], ports: [{port: 80}]}
---
kind: Service
metadata: {name: headless, namespace: x}
spec: {clusterIP: None, ports: [{port: 80}]}
---
kind: Service
metadata: {name: dns, namespace: y}
spec: {clusterIP: 10.96.0.53, ports: [{port: 53, protocol: UDP}]}
""",
    )
    assert service_ips(index) == {"10.96.0.10", "10.96.0.53"}
    # Services add nothing to any pod's rules: connections are judged after DNAT.
    assert index.resolve(X_A).endpoint.ingress is None
    index.delete_service(("y", "dns"))
    assert service_ips(index) == {"10.96.0.10"}


def datapath_allows(compiled: CompiledDirection, peer: str, port: int, protocol: str) -> bool:
    """What bpf/policy.h decides on the tables compile_direction builds for it."""
    address = ipaddress.IPv4Address(peer)
    best = max(
        (net for net in compiled.peers if address in net),
        key=lambda net: net.prefixlen,
        default=None,
    )
    if best is None:
        return False
    peer_set = compiled.peers[best]
    proto = PROTOCOL_NUMBERS[protocol]
    if port and (peer_set, proto, port) in compiled.rules:
        return True
    rule = compiled.rules.get((peer_set, proto, 0))
    if rule is not None:
        if rule.flags & RULE_ANY_PORT:
            return True
        if any(rule.ranges[i].first <= port <= rule.ranges[i].last for i in range(rule.nranges)):
            return True
    return (peer_set, 0, 0) in compiled.rules


def random_flow(rng: random.Random, addresses: list[str]) -> tuple[str, int, str]:
    peer = rng.choice(
        [
            *addresses,
            f"10.0.{rng.randrange(2)}.{rng.randrange(256)}",
            f"192.168.{rng.randrange(3)}.{rng.randrange(256)}",
            f"{rng.randrange(1, 224)}.{rng.randrange(256)}.0.1",
        ]
    )
    protocol = rng.choice(("tcp", "udp", "sctp", "icmp"))
    port = 0 if protocol == "icmp" else rng.choice((53, 80, 81, 9100, 9005, 9150, 60, 443))
    return peer, port, protocol


@pytest.mark.parametrize("seed", range(8))
def test_verdict_agrees_with_the_compiled_endpoint_policy(seed: int) -> None:
    rng = random.Random(seed)
    index = random_cluster.index_of(random_cluster.cluster(rng, pods=30, policies=10))
    addresses = [ip for p in index.store.all_pods() for ip in p.ips if ":" not in ip]
    outcomes: dict[tuple[bool, bool], int] = {}  # (isolated, allowed) -> flows
    for key in sorted(index.local_pods()):
        resolved = index.resolve(key)
        for direction in ("ingress", "egress"):
            rules = resolved.rules(direction)
            compiled = None if rules is None else compile_direction(rules)
            for _ in range(60):
                peer, port, protocol = random_flow(rng, addresses)
                judged = verdict(index, key, direction, peer, port, protocol)
                # A pod's traffic to its own address never leaves it: not the datapath's.
                found = index.pod(key)
                itself = found is not None and peer in found.ips
                expected = (
                    compiled is None or itself or datapath_allows(compiled, peer, port, protocol)
                )
                assert judged.allowed == expected, (key, direction, peer, port, protocol, rules)
                outcome = (rules is not None, expected)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Isolated directions were judged, and both ways.
    assert outcomes.get((True, True), 0) > 20 and outcomes.get((True, False), 0) > 20


def test_ports_any_protocol_is_understood() -> None:
    """The datapath's "any" protocol (never produced here) still reads right."""
    rule = AllowRule((), (Ports("any"),))
    assert datapath_allows(compile_direction((rule,)), "1.2.3.4", 0, "icmp")
