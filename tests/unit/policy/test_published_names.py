"""The controller's objects' API paths, names and labels (``published.names``)."""

from __future__ import annotations

from cni.policy.model import NetworkPolicy
from cni.policy.published.names import (
    ADDRESS_SET,
    LABEL_LIMIT,
    NAME_LIMIT,
    POLICY_ENDPOINTS,
    POLICY_LABEL,
    collection_path,
    object_path,
    pod_name,
    policy_endpoints_name,
    policy_label,
)
from cni.policy.published.render import policy_endpoints_object


def test_paths_are_the_crds_cluster_scoped_collections() -> None:
    assert collection_path(ADDRESS_SET) == "/apis/sluice.dev/v1alpha1/addresssets"
    assert object_path(POLICY_ENDPOINTS, "x.p") == "/apis/sluice.dev/v1alpha1/policyendpoints/x.p"
    assert pod_name(("x", "a")) == "x/a"


def test_short_names_are_kept_and_long_ones_shortened_apart() -> None:
    assert policy_endpoints_name("x", "allow") == "x.allow"
    assert policy_label("allow") == "allow"
    long, longer = "p" * 300, "p" * 301
    assert len(policy_endpoints_name("x", long)) <= NAME_LIMIT
    assert policy_endpoints_name("x", long) != policy_endpoints_name("x", longer)
    assert len(policy_label(long)) <= LABEL_LIMIT
    assert policy_label(long) != policy_label(longer)


def test_a_policy_endpoints_carries_its_policys_label() -> None:
    policy = NetworkPolicy("x", "q" * 100)
    body = policy_endpoints_object(policy, "uid", 1, [], [])
    assert body["metadata"]["labels"][POLICY_LABEL] == policy_label(policy.name)
    assert body["metadata"]["name"] == policy_endpoints_name("x", policy.name)
