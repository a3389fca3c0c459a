"""The route keeper's plan: the routes the cluster asks for against those present;
a view that is not complete never removes anything."""

from __future__ import annotations

from ipaddress import IPv4Address as A
from ipaddress import IPv4Network as N

import pytest

from cni.agent.route_plan import Claimed, desired_routes, plan, plan_peers
from cni.kube.nodes import NodeAddressing, parse_node
from cni.net.peer_routes import PeerRoute
from ipam.claims import PoolBlocks

ME = NodeAddressing("n1", (N("10.244.1.0/24"),), A("192.168.5.1"))
TWO = NodeAddressing("n2", (N("10.244.2.0/24"),), A("192.168.5.2"))
THREE = NodeAddressing("n3", (N("10.244.3.0/24"),), A("192.168.5.3"))
OWN = [N("10.244.1.0/24")]
POOL = N("10.8.0.0/24")
BLOCKS = PoolBlocks(POOL, 28)


def route(dst: str, via: str, tunnel: bool = False) -> PeerRoute:
    return PeerRoute(N(dst), A(via), tunnel)


def test_one_route_per_remote_range_none_to_itself() -> None:
    wanted = desired_routes([ME, TWO, THREE], "n1", OWN, tunnel=False)
    assert wanted.routes == {
        N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2"),
        N("10.244.3.0/24"): route("10.244.3.0/24", "192.168.5.3"),
    }
    assert wanted.skipped == {}


def test_nodes_without_address_or_range_get_none_overlaps_are_skipped() -> None:
    bare = NodeAddressing("n4", (N("10.244.4.0/24"),), None)
    rangeless = NodeAddressing("n5", (), A("192.168.5.5"))
    mine = NodeAddressing("n6", (N("10.244.1.0/25"),), A("192.168.5.6"))
    wanted = desired_routes([ME, TWO, bare, rangeless, mine], "n1", OWN, tunnel=False)
    assert list(wanted.routes) == [N("10.244.2.0/24")]
    assert set(wanted.skipped) == {N("10.244.1.0/25")}


def test_overlapping_ranges_of_two_nodes_are_both_left_out_in_any_order() -> None:
    # A Node written to take over n2's pods: a wider range sorts first, a narrower one
    # would win the longest match. Neither may divert n2's traffic, nor be routed itself.
    for forged in (N("10.244.2.0/23"), N("10.244.2.128/25"), N("10.244.2.0/24")):
        intruder = NodeAddressing("n0", (forged,), A("192.168.5.66"))
        for order in ([ME, TWO, THREE, intruder], [intruder, THREE, TWO, ME]):
            wanted = desired_routes(order, "n1", OWN, tunnel=False)
            taken = {n.pod_cidrs[0] for n in (TWO, THREE) if n.pod_cidrs[0].overlaps(forged)}
            assert N("10.244.2.0/24") in taken
            assert set(wanted.routes) == {N("10.244.2.0/24"), N("10.244.3.0/24")} - taken
            assert set(wanted.skipped) == taken | {forged}
            assert "neither is routed" in wanted.skipped[forged]


def test_a_node_whose_internal_ip_is_a_pod_address_gets_no_route() -> None:
    # Via a local pod's address (its /32 is on-link) the route would hand the range to it.
    for gateway in ("10.244.1.5", "10.244.3.7", "10.244.9.1"):
        decoy = NodeAddressing("n9", (N("10.244.9.0/24"),), A(gateway))
        wanted = desired_routes([ME, TWO, THREE, decoy], "n1", OWN, tunnel=False)
        assert N("10.244.9.0/24") not in wanted.routes
        assert f"InternalIP {gateway} is a pod address" in wanted.skipped[N("10.244.9.0/24")]
        assert set(wanted.routes) == {N("10.244.2.0/24"), N("10.244.3.0/24")}


def claimed(prefix: str, node: str, pool: N | None = POOL) -> Claimed:
    return Claimed(N(prefix), node, pool)


def test_prefix_mode_claims_of_this_node_count_as_its_own() -> None:
    # Not routed, and a pod range: a node whose InternalIP lies in one gets no route.
    decoy = NodeAddressing("n9", (), A("10.8.0.5"))
    claims = [claimed("10.8.0.0/28", "n1"), claimed("10.8.0.16/28", "n9")]
    wanted = desired_routes([ME, decoy], "n1", [], tunnel=True, claims=claims, blocks=BLOCKS)
    assert wanted.routes == {} and wanted.own == (N("10.8.0.0/28"),)
    assert "is a pod address (in 10.8.0.0/28)" in wanted.skipped[N("10.8.0.16/28")]


def test_prefix_mode_routes_each_prefix_another_node_holds() -> None:
    claims = [
        claimed("10.8.0.0/28", "n1"),
        claimed("10.8.0.16/28", "n2"),
        claimed("10.8.0.32/28", "n2"),
        claimed("10.8.0.48/28", "gone"),  # its Node is not known
    ]
    wanted = desired_routes([ME, TWO], "n1", [], tunnel=True, claims=claims, blocks=BLOCKS)
    assert wanted.routes == {
        N("10.8.0.16/28"): route("10.8.0.16/28", "192.168.5.2", True),
        N("10.8.0.32/28"): route("10.8.0.32/28", "192.168.5.2", True),
    }


# Claims that are no /28 block of 10.8.0.0/24, and what each would do if it counted.
HOSTILE_CLAIMS = {
    "the cloud metadata address": claimed("169.254.169.254/32", "n2"),
    "an eighth of the address space": claimed("0.0.0.0/5", "n2"),
    "the node network (every InternalIP a pod address)": claimed("192.168.5.0/24", "n2"),
    "the whole pool (overlapping every block)": claimed("10.8.0.0/24", "n2"),
    "a prefix over the pool, as this node's own": claimed("10.8.0.0/16", "n1"),
    "a block of the pool too long": claimed("10.8.0.64/29", "n2"),
    "a block of the pool too short": claimed("10.8.0.128/27", "n2"),
    "a /28 beside the pool": claimed("10.8.1.0/28", "n2"),
    "a /28 of the pool stating another pool": claimed("10.8.0.96/28", "n2", N("10.8.0.0/16")),
    "a /28 of the pool stating no readable pool": claimed("10.8.0.112/28", "n2", None),
}


@pytest.mark.parametrize("what", list(HOSTILE_CLAIMS))
def test_a_claim_that_is_no_block_of_the_pool_is_refused_and_changes_nothing(what: str) -> None:
    hostile = HOSTILE_CLAIMS[what]
    legit = [claimed("10.8.0.0/28", "n1"), claimed("10.8.0.16/28", "n2")]
    for claims in ([*legit, hostile], [hostile, *legit]):
        wanted = desired_routes([ME, TWO], "n1", [], tunnel=False, claims=claims, blocks=BLOCKS)
        assert wanted.routes == {N("10.8.0.16/28"): route("10.8.0.16/28", "192.168.5.2")}, what
        assert wanted.own == (N("10.8.0.0/28"),), what
        assert list(wanted.skipped) == [hostile.prefix], what
        assert (
            f"node {hostile.node}'s PrefixClaim of {hostile.prefix} is refused: "
            in (wanted.skipped[hostile.prefix])
        )


def test_claims_are_never_routed_without_the_pool_they_must_be_blocks_of() -> None:
    with pytest.raises(ValueError):
        desired_routes([ME, TWO], "n1", [], tunnel=False, claims=[claimed("10.8.0.16/28", "n2")])


def test_why_a_claim_is_no_block_of_the_pool() -> None:
    assert BLOCKS.misfit(N("10.8.0.16/28"), POOL) is None
    assert BLOCKS.misfit(N("10.8.0.16/28"), N("10.8.0.0/16")) == (
        "it states pool 10.8.0.0/16, not 10.8.0.0/24"
    )
    assert BLOCKS.misfit(N("10.8.0.16/28"), None) == "it states no IPv4 pool, not 10.8.0.0/24"
    assert BLOCKS.misfit(N("10.8.1.0/28"), POOL) == "10.8.1.0/28 is outside pool 10.8.0.0/24"
    assert BLOCKS.misfit(N("10.8.0.0/24"), POOL) == "10.8.0.0/24 is a /24, not a /28 block"


def test_plan_writes_what_is_missing_or_different() -> None:
    desired = {r.dst: r for r in (route("10.244.2.0/24", "192.168.5.2"),
                                  route("10.244.3.0/24", "192.168.5.3"))}  # fmt: skip
    present = {N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2"),
               N("10.244.3.0/24"): route("10.244.3.0/24", "192.168.5.9")}  # fmt: skip
    steps = plan(desired, present, foreign=[], complete=True)
    assert steps.write == (route("10.244.3.0/24", "192.168.5.3"),)
    assert steps.remove == () and steps.blocked == ()


def test_a_mode_change_rewrites_every_route() -> None:
    present = {N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2")}
    desired = {N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2", tunnel=True)}
    assert plan(desired, present, [], complete=True).write == tuple(desired.values())


def test_removes_only_with_the_complete_view() -> None:
    present = {N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2"),
               N("10.244.3.0/24"): route("10.244.3.0/24", "192.168.5.3")}  # fmt: skip
    desired = {N("10.244.2.0/24"): present[N("10.244.2.0/24")]}
    assert plan(desired, present, [], complete=False).remove == ()
    assert plan({}, present, [], complete=False).remove == ()  # an empty partial list
    assert plan(desired, present, [], complete=True).remove == (N("10.244.3.0/24"),)


def test_a_foreign_route_is_never_replaced() -> None:
    desired = {N("10.244.2.0/24"): route("10.244.2.0/24", "192.168.5.2")}
    steps = plan(desired, {}, foreign=[N("10.244.2.0/24")], complete=True)
    assert steps.write == () and steps.blocked == (N("10.244.2.0/24"),)


def test_tunnel_peers_follow_the_routes() -> None:
    routes = {r.dst: r for r in (route("10.244.2.0/24", "192.168.5.2", True),
                                 route("10.244.3.0/24", "192.168.5.3", True))}  # fmt: skip
    peers = plan_peers(routes, whole=[A("192.168.5.2")], partial=[A("192.168.5.2"),
                       A("192.168.5.3"), A("192.168.5.9")], complete=True)  # fmt: skip
    assert peers.write == (A("192.168.5.3"),)  # its FDB entry was missing
    assert peers.remove == (A("192.168.5.9"),)
    assert plan_peers(routes, [], [A("192.168.5.9")], complete=False).remove == ()


def test_node_object_cut_to_what_routes_need() -> None:
    obj = {
        "metadata": {"name": "n2", "labels": {"a": "b"}},
        "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24", "fd00::/64"]},
        "status": {"addresses": [{"type": "Hostname", "address": "n2"},
                                 {"type": "InternalIP", "address": "fd00::2"},
                                 {"type": "InternalIP", "address": "192.168.5.2"}]},
    }  # fmt: skip
    assert parse_node(obj) == TWO
    assert parse_node({"metadata": {"name": "x"}, "spec": {"podCIDR": "bad"}}) == NodeAddressing(
        "x", (), None
    )
