"""Objects reach the resolvers and the controller's publisher one way: by their type."""

from __future__ import annotations

import pytest

from cni.controller.desired import PolicyRecord
from cni.controller.publisher import Publisher
from cni.policy.index import PolicyIndex
from cni.policy.model import Namespace, NetworkPolicy, Pod, Service
from cni.policy.published.identity import AddressSetInfo
from cni.policy.published.index import ShardIndex
from cni.policy.published.names import ADDRESS_SET


@pytest.mark.parametrize("receiver", [PolicyIndex(), ShardIndex("n0"), Publisher()])
def test_an_unknown_kind_is_refused_by_name(receiver: object) -> None:
    with pytest.raises(TypeError, match="takes no str"):
        receiver.upsert("a string")  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="replace_all\\(Pod\\) got a Namespace"):
        receiver.replace_all(Pod, [Namespace("x")])  # type: ignore[attr-defined]


def test_replace_all_makes_a_kind_exactly_what_was_listed() -> None:
    index = PolicyIndex("n0")
    index.replace_all(Pod, [Pod("x", "a", ips=("10.0.0.1",), node_name="n0"), Pod("x", "b")])
    index.upsert(Service("x", "s", ("10.96.0.1",)))
    index.replace_all(Pod, [Pod("x", "b")])
    assert [pod.key for pod in index.store.all_pods()] == [("x", "b")]
    assert index.local_pods() == frozenset()
    assert list(index.store.services) == [("x", "s")]
    index.replace_all(Service, [])
    assert index.store.services == {}


def test_the_publisher_takes_policies_with_their_uid_and_published_objects_by_kind() -> None:
    publisher = Publisher()
    policy = NetworkPolicy("x", "p")
    publisher.upsert(PolicyRecord(policy, "uid-1", 3))
    assert publisher.index.policy(policy.key) == policy
    info = AddressSetInfo(ADDRESS_SET, "", "as-1-0", "as-1", (), 0, 1)
    publisher.replace_all(AddressSetInfo, [info])
    assert publisher.published_count() == 1
    publisher.replace_all(AddressSetInfo, [])
    assert publisher.published_count() == 0
    publisher.delete(PolicyRecord(policy, "uid-1", 3))
    assert publisher.index.policy(policy.key) is None
