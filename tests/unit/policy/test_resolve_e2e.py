"""The resolver against the Kubernetes NetworkPolicy e2e suite's scenarios.

Each test applies policies to the x/y/z cluster (see ``cluster``) and
compares who can connect to whom with what Kubernetes expects.
"""

from __future__ import annotations

from cni.policy.vocabulary import Ports
from tests.unit.policy.cluster import (
    PODS,
    can_connect,
    cluster,
    everything,
    in_namespace,
    into,
    not_in,
    out_of,
    policy,
    reachability,
)

X_A = ("x", "a")
DENY_ALL_INGRESS_X = policy("x", "deny-ingress", "  podSelector: {}\n  policyTypes: [Ingress]")


def test_no_policy_everything_connects() -> None:
    index = cluster()
    assert reachability(index) == everything()
    for pod in PODS:
        assert index.resolve(pod).endpoint.ingress is None
        assert index.resolve(pod).endpoint.egress is None


def test_default_deny_ingress_isolates_the_namespace_only_for_ingress() -> None:
    index = cluster(DENY_ALL_INGRESS_X)
    assert reachability(index) == everything() - into(in_namespace("x"))
    resolved = index.resolve(X_A)
    assert resolved.endpoint.egress is None
    assert resolved.ingress_policies == (("x", "deny-ingress"),)


def test_default_deny_egress() -> None:
    index = cluster(policy("x", "deny-egress", "  podSelector: {}\n  policyTypes: [Egress]"))
    assert reachability(index) == everything() - out_of(in_namespace("x"))
    assert index.resolve(X_A).endpoint.ingress is None


def test_a_pod_may_always_reach_itself() -> None:
    index = cluster(
        policy("x", "deny-all", "  podSelector: {}\n  policyTypes: [Ingress, Egress]"),
    )
    assert can_connect(index, X_A, X_A, 80)
    assert can_connect(index, X_A, X_A, 12345, "UDP")
    assert not can_connect(index, X_A, ("x", "b"))


def test_allow_from_namespace_by_namespace_selector() -> None:
    allow = policy(
        "x",
        "allow-from-y",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {matchLabels: {ns: y}}}]""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - into({X_A}, not_in("y"))


def test_allow_from_pod_in_namespace_needs_both_selectors_to_match() -> None:
    allow = policy(
        "x",
        "allow-y-b",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {ns: y}}
          podSelector: {matchLabels: {pod: b}}""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - into({X_A}, set(PODS) - {("y", "b")})


def test_two_peers_are_either_not_both() -> None:
    """Two list entries (namespace y; pod b anywhere in x) are a union, unlike one entry."""
    allow = policy(
        "x",
        "union-peers",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {ns: y}}
        - podSelector: {matchLabels: {pod: b}}""",
    )
    index = cluster(allow)
    allowed = in_namespace("y") | {("x", "b")}
    assert reachability(index) == everything() - into({X_A}, set(PODS) - allowed)


def test_pod_selector_peer_means_the_policys_own_namespace() -> None:
    allow = policy(
        "x",
        "allow-b",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{podSelector: {matchLabels: {pod: b}}}]""",
    )
    index = cluster(allow)
    assert can_connect(index, ("x", "b"), X_A)
    assert not can_connect(index, ("y", "b"), X_A)
    assert not can_connect(index, ("x", "c"), X_A)


def test_empty_namespace_selector_means_every_namespace() -> None:
    allow = policy(
        "x",
        "allow-b-anywhere",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: b}}}]""",
    )
    index = cluster(allow)
    sources = {("x", "b"), ("y", "b"), ("z", "b")}
    assert reachability(index) == everything() - into({X_A}, set(PODS) - sources)


def test_empty_ingress_rule_allows_everything_in() -> None:
    allow = policy("x", "allow-all", "  podSelector: {}\n  ingress: [{}]")
    index = cluster(DENY_ALL_INGRESS_X, allow)
    assert reachability(index) == everything()


def test_match_expressions_each_operator() -> None:
    def sources(expression: str) -> set[tuple[str, str]]:
        allow = policy(
            "x",
            "expr",
            f"""  podSelector: {{matchLabels: {{pod: a}}}}
  ingress:
    - from: [{{namespaceSelector: {{}}, podSelector: {{matchExpressions: [{expression}]}}}}]""",
        )
        index = cluster(allow)
        return {pod for pod in PODS if pod != X_A and can_connect(index, pod, X_A)}

    b_and_c = {(ns, p) for ns, p in PODS if p in ("b", "c")}
    assert sources("{key: pod, operator: In, values: [b, c]}") == b_and_c
    assert sources("{key: pod, operator: NotIn, values: [b]}") == {
        (ns, p) for ns, p in PODS if p != "b"
    } - {X_A}
    assert sources("{key: pod, operator: Exists}") == set(PODS) - {X_A}
    assert sources("{key: pod, operator: DoesNotExist}") == set()
    # NotIn matches pods without the key at all, DoesNotExist matches only those.
    assert sources("{key: absent, operator: NotIn, values: [v]}") == set(PODS) - {X_A}
    assert sources("{key: absent, operator: DoesNotExist}") == set(PODS) - {X_A}


def test_namespace_selector_match_expressions() -> None:
    allow = policy(
        "x",
        "not-from-y",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [y]}]}}]""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - into({X_A}, in_namespace("y"))


def test_namespace_name_label_is_always_there() -> None:
    allow = policy(
        "x",
        "from-z-by-name",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - into({X_A}, not_in("z"))


def test_ip_block_with_except() -> None:
    # 10.0.0.0/8 covers every pod; the except takes namespace y's /16 out, except
    # y/b is added back by a second peer.
    allow = policy(
        "x",
        "cidr",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from:
        - ipBlock: {cidr: 10.0.0.0/8, except: [10.2.0.0/16]}
        - ipBlock: {cidr: 10.2.0.2/32}""",
    )
    index = cluster(allow)
    denied = in_namespace("y") - {("y", "b")}
    assert reachability(index) == everything() - into({X_A}, denied)


def test_egress_to_ip_block() -> None:
    allow = policy(
        "x",
        "egress-cidr",
        """  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
    - to: [{ipBlock: {cidr: 10.3.0.0/16, except: [10.3.0.3/32]}}]""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - out_of({X_A}, set(PODS) - {("z", "a"), ("z", "b")})


def test_named_port_ingress_uses_the_target_pods_port() -> None:
    allow = policy(
        "x",
        "named",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - ports: [{port: serve-81-tcp}]""",
    )
    index = cluster(allow)
    assert can_connect(index, ("y", "b"), X_A, 81, "TCP")
    assert not can_connect(index, ("y", "b"), X_A, 80, "TCP")
    assert not can_connect(index, ("y", "b"), X_A, 81, "UDP")  # name and protocol must match


def test_named_port_needs_matching_protocol() -> None:
    """serve-80-udp is a UDP port: a rule naming it with TCP allows nothing."""
    allow = policy(
        "x",
        "named-wrong-protocol",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - ports: [{port: serve-80-udp, protocol: TCP}]""",
    )
    index = cluster(allow)
    assert reachability(index, 80, "TCP") == everything() - into({X_A})
    assert reachability(index, 80, "UDP") == everything() - into({X_A})
    # Isolated, and no rule is left.
    assert index.resolve(X_A).endpoint.ingress == ()


def test_named_port_egress_uses_each_peer_pods_port() -> None:
    extra_port_pod = """
apiVersion: v1
kind: Pod
metadata: {name: d, namespace: y, labels: {pod: d}}
spec: {nodeName: node-2, containers: [{name: web, ports: [{name: web, containerPort: 8080}]}]}
status: {podIP: 10.2.0.4}
"""
    allow = policy(
        "x",
        "egress-named",
        """  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
    - to: [{namespaceSelector: {matchLabels: {ns: y}}}]
      ports: [{port: serve-81-udp, protocol: UDP}, {port: web}]""",
    )
    index = cluster(extra_port_pod, allow)
    assert can_connect(index, X_A, ("y", "b"), 81, "UDP")
    assert not can_connect(index, X_A, ("y", "b"), 80, "UDP")
    assert not can_connect(index, X_A, ("z", "b"), 81, "UDP")
    egress = index.resolve(X_A).endpoint.egress
    assert egress is not None
    # y/a, y/b, y/c resolve to UDP 81 and share a rule; y/d resolves to TCP 8080.
    by_ports = {rule.ports: {p.cidr for p in rule.peers} for rule in egress}
    assert by_ports == {
        (Ports("udp", 81, 81),): {"10.2.0.1/32", "10.2.0.2/32", "10.2.0.3/32"},
        (Ports("tcp", 8080, 8080),): {"10.2.0.4/32"},
    }


def test_named_port_egress_to_ip_block_reaches_pods_inside_it() -> None:
    allow = policy(
        "x",
        "egress-named-cidr",
        """  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
    - to: [{ipBlock: {cidr: 10.3.0.0/16, except: [10.3.0.3/32]}}]
      ports: [{port: serve-80-tcp}]""",
    )
    index = cluster(allow)
    assert {t for s, t in reachability(index) if s == X_A} == {("z", "a"), ("z", "b")}
    assert reachability(index, 81) - out_of({X_A}) == reachability(index, 81)


def test_end_port_range() -> None:
    allow = policy(
        "x",
        "range",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - ports: [{protocol: TCP, port: 80, endPort: 81}]""",
    )
    index = cluster(allow)
    assert can_connect(index, ("y", "b"), X_A, 80)
    assert can_connect(index, ("y", "b"), X_A, 81)
    assert not can_connect(index, ("y", "b"), X_A, 82)
    assert not can_connect(index, ("y", "b"), X_A, 80, "UDP")


def test_multiple_ports_and_protocols() -> None:
    allow = policy(
        "x",
        "ports",
        """  podSelector: {matchLabels: {pod: a}}
  ingress:
    - ports: [{port: 80}, {protocol: UDP, port: 81}, {protocol: SCTP}]""",
    )
    index = cluster(allow)
    source = ("y", "b")
    assert can_connect(index, source, X_A, 80, "TCP")
    assert not can_connect(index, source, X_A, 81, "TCP")
    assert can_connect(index, source, X_A, 81, "UDP")
    assert not can_connect(index, source, X_A, 80, "UDP")
    assert can_connect(index, source, X_A, 80, "SCTP")  # no port: every SCTP port
    assert can_connect(index, source, X_A, 81, "SCTP")
    assert not can_connect(index, source, X_A, 0, "ICMP")


def test_rule_without_ports_allows_every_protocol_including_icmp() -> None:
    allow = policy(
        "x",
        "from-y",
        """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]""",
    )
    index = cluster(allow)
    assert can_connect(index, ("y", "c"), X_A, 0, "ICMP")
    assert can_connect(index, ("y", "c"), X_A, 9999, "SCTP")


def test_policy_types_default_adds_egress_when_there_are_egress_rules() -> None:
    spec = """  podSelector: {matchLabels: {pod: a}}
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}}]}]"""
    index = cluster(policy("x", "egress-default", spec))
    resolved = index.resolve(X_A)
    assert resolved.endpoint.ingress == ()
    assert resolved.endpoint.egress is not None
    assert reachability(index) == everything() - into({X_A}) - out_of({X_A}) | {(X_A, ("x", "b"))}


def test_explicit_egress_only_ignores_ingress_rules_and_leaves_ingress_open() -> None:
    spec = """  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]"""
    index = cluster(policy("x", "egress-only", spec))
    resolved = index.resolve(X_A)
    assert resolved.endpoint.ingress is None
    assert resolved.endpoint.egress == ()
    assert reachability(index) == everything() - out_of({X_A})


def test_policies_add_up() -> None:
    from_y = policy(
        "x",
        "from-y",
        """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 80}]}]""",
    )
    from_z_81 = policy(
        "x",
        "from-z",
        """  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}], ports: [{port: 81}]}]""",
    )
    index = cluster(from_y, from_z_81)
    assert index.resolve(X_A).selected_by == (("x", "from-y"), ("x", "from-z"))
    assert can_connect(index, ("y", "a"), X_A, 80)
    assert not can_connect(index, ("y", "a"), X_A, 81)
    assert can_connect(index, ("z", "a"), X_A, 81)
    assert not can_connect(index, ("z", "a"), X_A, 80)
    # from-z selects every pod of x, so x/b is isolated too but only by it.
    assert not can_connect(index, ("y", "a"), ("x", "b"), 80)


def test_empty_pod_selector_selects_every_pod_of_the_namespace_only() -> None:
    index = cluster(DENY_ALL_INGRESS_X)
    for pod in PODS:
        isolated = index.resolve(pod).endpoint.ingress is not None
        assert isolated == (pod[0] == "x")


def test_selector_that_matches_no_pod_allows_nothing_not_everything() -> None:
    allow = policy(
        "x",
        "from-nobody",
        """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: nobody}}}]}]""",
    )
    index = cluster(allow)
    assert index.resolve(X_A).endpoint.ingress == ()
    assert reachability(index) == everything() - into({X_A})


def test_ipv6_block_cannot_widen_to_any_peer() -> None:
    """The datapath is IPv4-only: an IPv6-only rule allows nothing (and never any peer)."""
    allow = policy(
        "x",
        "v6",
        """  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{ipBlock: {cidr: "fd00::/8"}}]}]""",
    )
    index = cluster(allow)
    assert reachability(index) == everything() - into({X_A})


def test_sctp_port() -> None:
    allow = policy(
        "x",
        "sctp",
        """  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{protocol: SCTP, port: 80}]}]""",
    )
    index = cluster(allow)
    assert can_connect(index, ("z", "c"), X_A, 80, "SCTP")
    assert not can_connect(index, ("z", "c"), X_A, 80, "TCP")
