"""No inherited identity: an address belongs to one pod at a time, so a new pod given
a gone pod's address (before the API reports that pod gone) gets none of the
allowances meant for it, on any node and in the controller's sets."""

from __future__ import annotations

from dataclasses import replace

from cni.controller.publisher import Publisher
from cni.policy.index import PolicyIndex
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyRule,
    labels_of,
)
from tests.unit.controller.published_api import PublishedStore, publish

FRIENDS = LabelSelector(labels_of({"role": "friend"}))
SERVER = Pod("x", "server", labels_of({"role": "server"}), ("10.0.0.1",), "n0", uid="u-s")
FRIEND = Pod("x", "friend", labels_of({"role": "friend"}), ("10.0.0.2",), "n1", uid="u-f")
# A new pod given the friend's address, before the API reports the friend gone.
STRANGER = Pod("x", "stranger", labels_of({"role": "stranger"}), ("10.0.0.2",), "n1", uid="u-x")
ALLOW_FRIENDS = NetworkPolicy(
    "x",
    "from-friends",
    LabelSelector(labels_of({"role": "server"})),
    ingress=(PolicyRule((Peer(pod_selector=FRIENDS),)),),
)


def server_peers(index: PolicyIndex) -> set[str]:
    rules = index.resolve(SERVER.key).endpoint.ingress
    assert rules is not None
    return {peer.cidr for rule in rules for peer in rule.peers}


def index_on(node: str) -> PolicyIndex:
    index = PolicyIndex(node)
    for obj in (Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})), SERVER, FRIEND):
        index.upsert(obj)
    index.upsert(ALLOW_FRIENDS)
    return index


def test_an_address_two_pods_claim_is_neithers_peer() -> None:
    index = index_on("n0")  # the server's node: the stranger is remote
    assert server_peers(index) == {"10.0.0.2/32"}
    affected = index.upsert(STRANGER)
    assert SERVER.key in affected
    assert server_peers(index) == set()  # the friend's allowance is not the stranger's
    index.delete(FRIEND)  # the API reports the friend gone
    assert server_peers(index) == set()  # and the stranger never was a friend


def test_the_node_that_wired_an_address_knows_whose_it_is() -> None:
    index = index_on("n1")  # where both pods ran: the stranger is wired here now
    index.upsert_pod(replace(FRIEND, node_name=""))  # as the agent has a pod it no longer wires
    index.upsert_pod(STRANGER)
    # The stranger holds the address (it is local); the stale friend does not.
    assert index.peer_view(FRIEND).ips == () and index.peer_view(STRANGER).ips == ("10.0.0.2",)
    assert server_peers(index) == set()


def test_a_new_endpoint_waits_while_the_api_gives_its_address_to_another_pod() -> None:
    index = index_on("n1")
    held = index.address_held(STRANGER.key, STRANGER.ips)
    assert held == "address 10.0.0.2 is still pod x/friend's (uid u-f) as the API reports it"
    assert index.address_held(FRIEND.key, FRIEND.ips) is None
    index.delete(FRIEND)
    assert index.address_held(STRANGER.key, STRANGER.ips) is None


def test_the_controller_publishes_no_contested_address() -> None:
    publisher = Publisher()
    store = PublishedStore()
    for obj in (Namespace("x", labels_of({NAMESPACE_NAME_LABEL: "x"})), SERVER, FRIEND):
        publisher.upsert(obj)
    publisher.put_policy(ALLOW_FRIENDS, "u-p", 1)
    publish(publisher, store)

    def friends_set() -> list[list[str]]:
        return [
            entry["ips"]
            for (kind, _), body in store.objects.items()
            if kind == "AddressSet"
            for entry in body["spec"]["pods"]
        ]

    assert friends_set() == [["10.0.0.2"]]
    publisher.upsert(STRANGER)
    publish(publisher, store)
    assert friends_set() == []  # the friend's entry lost the contested address
