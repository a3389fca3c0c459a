"""The completeness rule, and the objects' JSON in and out."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from cni.policy.errors import PolicyInputError
from cni.policy.model import ContainerPort, LabelSelector, Pod, labels_of
from cni.policy.published.identity import PolicyEndpointsInfo, ShardInfo
from cni.policy.published.names import (
    ADDRESS_SET,
    PLURALS,
    POLICY_ENDPOINTS,
    address_set_id,
    node_label,
    node_label_key,
    policy_targets_name,
    spec_hash,
)
from cni.policy.published.render import (
    address_set_object,
    policy_endpoints_object,
    policy_targets_object,
)
from cni.policy.published.sets import AddressSetKey
from cni.policy.published.shards import (
    TargetEntry,
    parse_address_set,
    parse_policy_endpoints,
    parse_policy_targets,
)
from cni.policy.published.shardsets import ShardSets
from cni.policy.selectors import PodGroup
from tests.unit.policy import random_cluster


@dataclass(frozen=True)
class Shard:
    info: ShardInfo


def shard(index: int, count: int, version: str = "1", name: str = "") -> Shard:
    return Shard(
        PolicyEndpointsInfo(
            POLICY_ENDPOINTS, name or f"x.p-{version}-{index}", "x", "p", (version,), index, count
        )
    )


def test_a_set_is_complete_with_every_shard_of_one_version_and_count() -> None:
    sets: ShardSets[Shard] = ShardSets()
    key = (POLICY_ENDPOINTS, "x", "p")
    assert not sets.put(shard(1, 2))
    assert sets.complete(key) is None
    assert sets.put(shard(0, 2))
    old = sets.complete(key)
    assert old is not None and len(old) == 2
    # A new version, one shard at a time: the old version stays in use until the last.
    assert not sets.put(shard(0, 3, "2"))
    assert not sets.put(shard(2, 3, "2"))
    assert sets.complete(key) == old
    assert sets.put(shard(1, 3, "2"))
    new = sets.complete(key)
    assert new is not None and [s.info.version for s in new] == [("2",)] * 3


def test_a_missing_shard_removes_nothing_until_the_set_is_gone() -> None:
    sets: ShardSets[Shard] = ShardSets()
    key = (POLICY_ENDPOINTS, "x", "p")
    first, second = shard(0, 2), shard(1, 2)
    sets.put(first)
    sets.put(second)
    complete = sets.complete(key)
    assert not sets.remove(first)
    assert sets.complete(key) == complete
    assert sets.remove(second)
    assert sets.complete(key) is None


def test_a_relist_keeps_a_complete_set_whose_shards_are_partly_missing() -> None:
    sets: ShardSets[Shard] = ShardSets()
    sets.put(shard(0, 2))
    sets.put(shard(1, 2))
    complete = sets.complete((POLICY_ENDPOINTS, "x", "p"))
    assert sets.replace_all([shard(0, 3, "2")]) == set()
    assert sets.complete((POLICY_ENDPOINTS, "x", "p")) == complete
    assert sets.replace_all([]) == {(POLICY_ENDPOINTS, "x", "p")}


def test_objects_read_back_as_written() -> None:
    key = AddressSetKey(
        PodGroup(None, LabelSelector(labels_of({"team": "a"})), LabelSelector()),
        ports=True,
        only_named=frozenset({("http", "TCP")}),
    )
    pods = [
        Pod(
            "x",
            "a",
            ips=("10.0.0.1", "fd00::1"),
            ports=(ContainerPort("http", 80), ContainerPort("", 81)),
        ),
        Pod("y", "b", ips=("10.0.0.2",)),
    ]
    body = json.loads(json.dumps(address_set_object(key, 0, 2, pods, ["node-1"])))
    parsed = parse_address_set(body)
    assert [(p.key, p.ips, p.ports) for p in parsed.pods] == [
        (("x", "a"), ("10.0.0.1", "fd00::1"), (ContainerPort("http", 80),)),
        (("y", "b"), ("10.0.0.2",), ()),
    ]
    assert parsed.info.set_name == address_set_id(key)
    assert (parsed.info.index, parsed.info.count) == (0, 2)
    assert node_label_key("node-1") in body["metadata"]["labels"]

    for policy in (random_cluster.policy(random.Random(seed), seed) for seed in range(50)):
        body = policy_endpoints_object(policy, "u", 3, ["as-1"], ["n"])
        parsed_policy = parse_policy_endpoints(json.loads(json.dumps(body)))
        assert parsed_policy.policy == policy
        assert parsed_policy.info.version == ("u", "3")
        assert spec_hash(json.loads(json.dumps(body["spec"]))) == spec_hash(body["spec"])

    entries = [TargetEntry(("x", "a"), "uid-a", ("p1", "p2"))]
    targets = parse_policy_targets(policy_targets_object("n", 0, 1, entries))
    assert targets.entries == tuple(entries)


def test_long_node_names_make_valid_labels_and_names() -> None:
    node = "node-" + "x" * 100 + ".example.com"
    label = node_label(node)
    assert len(label) <= 63 and label[-1].isalnum()
    assert node_label(node) == label and node_label(node + "y") != label
    assert len(policy_targets_name(node, 12)) <= 253


def test_a_bad_object_names_itself_the_field_and_the_value() -> None:
    body = address_set_object(AddressSetKey(PodGroup("x", None, LabelSelector())), 0, 1, [], [])
    body["spec"]["shardIndex"] = 3
    with pytest.raises(PolicyInputError, match=r"AddressSet as-\w+-0: spec.shardIndex 3 is not"):
        parse_address_set(body)
    body["spec"]["shardIndex"] = 0
    body["spec"]["pods"] = [{"pod": "no-slash", "ips": []}]
    with pytest.raises(PolicyInputError, match=r'spec.pods\[0\].pod "no-slash" must be NAMESPACE'):
        parse_address_set(body)
    assert ADDRESS_SET in PLURALS
