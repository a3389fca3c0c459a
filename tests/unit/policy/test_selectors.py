"""Label selectors and what a NetworkPolicy peer means."""

from __future__ import annotations

import yaml

from cni.policy.model import EVERYTHING, IPBlock, Labels, LabelSelector, Requirement, labels_of
from cni.policy.parse_policy import parse_network_policy
from cni.policy.selectors import (
    PodGroup,
    describe_selector,
    ip_block_contains,
    peer_group,
    selector_matches,
)

WEB = labels_of({"app": "web", "tier": "front"})


def test_empty_selector_matches_everything() -> None:
    assert selector_matches(EVERYTHING, WEB)
    assert selector_matches(EVERYTHING, labels_of({}))


def test_match_labels_and_expressions_must_all_hold() -> None:
    selector = LabelSelector(
        labels_of({"app": "web"}),
        (
            Requirement("tier", "In", frozenset({"front", "back"})),
            Requirement("legacy", "DoesNotExist"),
        ),
    )
    assert selector_matches(selector, WEB)
    assert not selector_matches(selector, labels_of({"app": "web", "tier": "db"}))
    assert not selector_matches(selector, labels_of({"app": "web", "tier": "front", "legacy": ""}))
    assert not selector_matches(selector, labels_of({"tier": "front"}))


def test_operators_on_present_and_absent_keys() -> None:
    def holds(operator: str, *values: str, labels: Labels = WEB) -> bool:
        return selector_matches(
            LabelSelector(match_expressions=(Requirement("tier", operator, frozenset(values)),)),
            labels,
        )

    bare = labels_of({"app": "web"})
    assert (
        holds("In", "front") and not holds("In", "back") and not holds("In", "front", labels=bare)
    )
    assert (
        holds("NotIn", "back") and not holds("NotIn", "front") and holds("NotIn", "x", labels=bare)
    )
    assert holds("Exists") and not holds("Exists", labels=bare)
    assert not holds("DoesNotExist") and holds("DoesNotExist", labels=bare)


def test_peer_groups_follow_the_three_selector_forms() -> None:
    policy = parse_network_policy(
        yaml.safe_load(
            """
metadata: {name: p, namespace: shop}
spec:
  podSelector: {}
  ingress:
    - from:
        - podSelector: {matchLabels: {app: web}}
        - namespaceSelector: {matchLabels: {team: a}}
        - namespaceSelector: {matchLabels: {team: a}}
          podSelector: {matchLabels: {app: web}}
        - ipBlock: {cidr: 10.0.0.0/8}
"""
        )
    )
    web = LabelSelector(labels_of({"app": "web"}))
    team = LabelSelector(labels_of({"team": "a"}))
    groups = [peer_group("shop", peer) for peer in policy.ingress[0].peers]
    assert groups == [
        PodGroup("shop", None, web),  # podSelector only: the policy's namespace
        PodGroup(None, team, EVERYTHING),  # namespaceSelector only: all their pods
        PodGroup(None, team, web),  # both: matching pods of matching namespaces
        None,  # ipBlock: addresses, no group
    ]
    assert str(groups[2]) == "pods app=web in namespaces team=a"


def test_ip_block_is_its_cidr_minus_excepts() -> None:
    block = IPBlock("10.0.0.0/16", ("10.0.1.0/24", "10.0.2.128/25"))
    assert ip_block_contains(block, "10.0.0.1")
    assert not ip_block_contains(block, "10.0.1.1")
    assert ip_block_contains(block, "10.0.2.127")
    assert not ip_block_contains(block, "10.0.2.200")
    assert not ip_block_contains(block, "10.1.0.1")
    assert not ip_block_contains(block, "fd00::1")
    assert ip_block_contains(IPBlock("fd00::/64"), "fd00::1")


def test_describe_selector() -> None:
    selector = LabelSelector(
        labels_of({"app": "web"}),
        (
            Requirement("legacy", "DoesNotExist"),
            Requirement("tier", "NotIn", frozenset({"db", "cache"})),
            Requirement("zone", "Exists"),
        ),
    )
    assert describe_selector(selector) == "app=web,!legacy,tier notin (cache,db),zone"
    assert describe_selector(EVERYTHING) == "{}"
