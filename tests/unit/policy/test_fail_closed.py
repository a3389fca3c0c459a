"""A NetworkPolicy the API server accepted is never dropped: what sluice reads is
enforced, what it cannot read isolates and allows nothing, and both resolver modes
agree; addresses are read as the API server reads them (leading zeros)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from cni.controller.publisher import Publisher
from cni.policy.errors import PolicyInputError
from cni.policy.explain import explain, verdict
from cni.policy.model import EVERYTHING, NetworkPolicy, PolicyRule
from cni.policy.parse_policy import parse_network_policy, read_network_policy
from cni.policy.published.index import ShardIndex
from cni.policy.render import policy_spec_json
from cni.policy.vocabulary import PeerCIDR
from tests.unit.controller.published_api import PublishedStore, publish
from tests.unit.policy.cluster import cluster

MAPPED = "::ffff:10.2.0.0/112"  # the API server accepts it (with a warning)


def raw(spec: str, name: str = "p") -> dict:
    return yaml.safe_load(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n"
        f"metadata: {{name: {name}, namespace: x, uid: u-{name}}}\nspec:\n" + spec
    )


TWO_RULES = f"""  podSelector: {{matchLabels: {{pod: a}}}}
  ingress:
    - from: [{{podSelector: {{matchLabels: {{pod: b}}}}}}]
    - from: [{{ipBlock: {{cidr: 10.0.0.0/8, except: ["{MAPPED}"]}}}}]"""


def test_legacy_leading_zeros_read_as_the_api_server_reads_them() -> None:
    policy = parse_network_policy(
        raw(
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 010.0.0.0/08, "
            "except: [010.002.0.0/16]}}]}]"
        )
    )
    block = policy.ingress[0].peers[0].ip_block
    assert block is not None and (block.cidr, block.excepts) == ("10.0.0.0/8", ("10.2.0.0/16",))
    assert not policy.refused


def test_strict_parsing_refuses_an_ipv4_mapped_cidr_and_says_why() -> None:
    with pytest.raises(PolicyInputError, match=r"IPv4-mapped IPv6 CIDR.*write it as IPv4"):
        parse_network_policy(raw(TWO_RULES))


def test_an_unreadable_rule_allows_nothing_and_the_others_hold() -> None:
    policy = read_network_policy(raw(TWO_RULES))
    assert policy.refused and policy.isolates("ingress")
    assert policy.ingress[0].refused == "" and policy.ingress[1].refused.startswith(
        'spec.ingress[1].from[0].ipBlock.except[0] "::ffff:10.2.0.0/112" is an IPv4-mapped'
    )
    index = cluster()
    index.upsert(policy)
    assert index.store.refused == {("x", "p")}
    rules = index.resolve(("x", "a")).endpoint.ingress
    assert rules is not None
    assert {peer for rule in rules for peer in rule.peers} == {PeerCIDR("10.1.0.2/32")}  # x/b
    denied = verdict(index, ("x", "a"), "ingress", "10.2.0.1", 80, "TCP")
    assert not denied.allowed and "x/p ingress rule 1 is refused and allows nothing" in (
        denied.reason
    )
    text = explain(index, ("x", "a")).to_text()
    assert "policy x/p is refused" in text
    assert "nothing by x/p ingress rule 1: refused, spec.ingress[1]" in text


def test_the_safe_reading_of_each_part() -> None:
    # An unreadable podSelector selects every pod of the namespace; unreadable
    # policyTypes isolate both directions; an unreadable egress list isolates egress.
    policy = read_network_policy(
        raw(
            "  podSelector: {matchLabels: {pod: '-bad-'}}\n  policyTypes: [Ingress, Sideways]\n"
            "  egress: 7"
        )
    )
    assert policy.pod_selector == EVERYTHING
    assert policy.policy_types == ("Ingress", "Egress")
    assert [rule.refused != "" for rule in policy.egress] == [True]
    assert len(policy.refusals) == 3
    index = cluster()
    index.upsert(policy)
    for pod in ("a", "b", "c"):
        endpoint = index.resolve(("x", pod)).endpoint
        assert endpoint.ingress == () and endpoint.egress == ()  # isolated, nothing allowed
    assert index.resolve(("y", "a")).endpoint.ingress is None


def test_without_policy_types_an_unreadable_egress_rule_still_isolates_egress() -> None:
    policy = read_network_policy(
        raw(f"  podSelector: {{}}\n  egress: [{{to: [{{ipBlock: {{cidr: '{MAPPED}'}}}}]}}]")
    )
    assert policy.isolates("egress") and policy.isolates("ingress")


def test_a_readable_policy_reads_as_before() -> None:
    spec = "  podSelector: {}\n  ingress: [{from: [{podSelector: {}}]}]"
    assert read_network_policy(raw(spec)) == parse_network_policy(raw(spec))


def test_the_published_form_keeps_what_was_refused() -> None:
    policy = read_network_policy(raw(TWO_RULES))
    again = parse_network_policy(
        {"metadata": {"namespace": "x", "name": "p"}, "spec": policy_spec_json(policy)},
        published=True,
    )
    assert again == policy
    # Outside the published form, a "refused" key is no rule of sluice's.
    assert parse_network_policy(
        {"metadata": {"namespace": "x", "name": "p"}, "spec": {"ingress": [{"refused": "x"}]}}
    ).ingress == (PolicyRule(),)


def test_the_controller_publishes_a_refused_policy_and_agents_enforce_it_alike() -> None:
    reference = cluster()
    publisher = Publisher()
    store = PublishedStore()
    for pod in list(reference.store.all_pods()):
        pod = replace(pod, uid=f"uid-{pod.namespace}-{pod.name}")  # as the API has them
        reference.upsert(pod)
        publisher.put_pod(pod)
    for namespace in reference.store.namespaces.values():
        publisher.put_namespace(namespace)
    policy = read_network_policy(raw(TWO_RULES))
    reference.upsert(policy)
    publisher.put_policy(policy, "u-p", 1)
    publish(publisher, store)
    agent = ShardIndex("node-1")
    for key in reference.local_pods():
        pod = reference.pod(key)
        assert pod is not None
        agent.upsert_pod(pod)
    store.feed(agent)
    assert agent.store.refused == {("x", "p")}
    for key in sorted(reference.local_pods()):
        assert agent.resolve(key).endpoint == reference.resolve(key).endpoint, key


def test_a_policy_whose_name_cannot_be_read_is_an_error() -> None:
    with pytest.raises(PolicyInputError, match=r"metadata\.name"):
        read_network_policy({"metadata": {"namespace": "x"}, "spec": {}})
    assert isinstance(read_network_policy(raw("  podSelector: {}")), NetworkPolicy)
