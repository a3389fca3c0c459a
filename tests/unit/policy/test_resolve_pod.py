"""How the policies that select a pod combine (``resolve_pod``), whoever compiled them."""

from __future__ import annotations

from cni.policy.model import ContainerPort, NetworkPolicy, Pod, PolicyKey
from cni.policy.resolve import ResolvedPolicy, resolve_pod
from cni.policy.rules import CompiledPolicy, CompiledRule, RuleOrigin
from cni.policy.vocabulary import AllowRule, PeerCIDR, Ports

POD = Pod("x", "a", ips=("10.0.0.1",), ports=(ContainerPort("http", 8080, "TCP"),))
FROM_B = AllowRule((PeerCIDR("10.0.0.2/32"),), (Ports("tcp", 80, 80),))
FROM_C = AllowRule((PeerCIDR("10.0.0.3/32"),))


def rule(key: PolicyKey, index: int, *allows: AllowRule) -> CompiledRule:
    return CompiledRule(RuleOrigin("ingress", key, index), allows)


def combined(
    policies: dict[PolicyKey, NetworkPolicy], compiled: dict[PolicyKey, CompiledPolicy]
) -> ResolvedPolicy:
    return resolve_pod(POD, sorted(policies), policies.__getitem__, compiled.__getitem__)


def test_a_pod_no_policy_selects_is_isolated_in_no_direction() -> None:
    resolved = combined({}, {})
    assert resolved.endpoint.ingress is None and resolved.endpoint.egress is None
    assert resolved.selected_by == ()


def test_the_isolating_policies_rules_are_their_union_in_key_order() -> None:
    p, q = ("x", "p"), ("x", "q")
    policies = {p: NetworkPolicy("x", "p"), q: NetworkPolicy("x", "q")}
    compiled = {
        q: CompiledPolicy(q, (rule(q, 0, FROM_C),), None),
        p: CompiledPolicy(p, (rule(p, 0, FROM_B), rule(p, 1)), None),
    }
    resolved = combined(policies, compiled)
    assert resolved.rules("ingress") == (FROM_B, FROM_C)
    assert [str(o) for o in resolved.origins("ingress")] == [
        "x/p ingress rule 0",
        "x/q ingress rule 0",
    ]
    assert resolved.policies("ingress") == (p, q)
    # Neither has egress rules or policyTypes: egress is not isolated.
    assert resolved.rules("egress") is None and resolved.policies("egress") == ()


def test_an_isolating_policy_without_rules_denies_all() -> None:
    d = ("x", "deny")
    policies = {d: NetworkPolicy("x", "deny", policy_types=("Ingress", "Egress"))}
    resolved = combined(policies, {d: CompiledPolicy(d, (), ())})
    assert resolved.endpoint.ingress == () and resolved.endpoint.egress == ()
    assert resolved.selected_by == (d,)


def test_named_ports_are_resolved_on_the_target_pod() -> None:
    n = ("x", "named")
    peers = (PeerCIDR("10.0.0.2/32"),)
    named = CompiledRule(RuleOrigin("ingress", n, 0), (), (("http", "TCP"),), peers)
    resolved = combined({n: NetworkPolicy("x", "named")}, {n: CompiledPolicy(n, (named,), None)})
    assert resolved.rules("ingress") == (AllowRule(peers, (Ports("tcp", 8080, 8080),)),)
