"""The route keeper's plan: the routes the cluster asks for against those present;
a view that is not complete never removes anything."""

from __future__ import annotations

from ipaddress import IPv4Address as A
from ipaddress import IPv4Network as N

from cni.agent.route_plan import Claimed, desired_routes, plan, plan_peers
from cni.kube.nodes import NodeAddressing, parse_node
from cni.net.peer_routes import PeerRoute

ME = NodeAddressing("n1", (N("10.244.1.0/24"),), A("192.168.5.1"))
TWO = NodeAddressing("n2", (N("10.244.2.0/24"),), A("192.168.5.2"))
THREE = NodeAddressing("n3", (N("10.244.3.0/24"),), A("192.168.5.3"))
OWN = [N("10.244.1.0/24")]


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


def test_prefix_mode_claims_of_this_node_count_as_its_own() -> None:
    claims = [Claimed(N("10.8.0.0/28"), "n1"), Claimed(N("10.8.0.0/27"), "n2")]
    wanted = desired_routes([ME, TWO], "n1", [], tunnel=True, claims=claims)
    assert wanted.routes == {} and "this node's own" in wanted.skipped[N("10.8.0.0/27")]


def test_prefix_mode_routes_each_prefix_another_node_holds() -> None:
    claims = [
        Claimed(N("10.8.0.0/28"), "n1"),
        Claimed(N("10.8.0.16/28"), "n2"),
        Claimed(N("10.8.0.32/28"), "n2"),
        Claimed(N("10.8.0.48/28"), "gone"),  # its Node is not known
    ]
    wanted = desired_routes([ME, TWO], "n1", [], tunnel=True, claims=claims)
    assert wanted.routes == {
        N("10.8.0.16/28"): route("10.8.0.16/28", "192.168.5.2", True),
        N("10.8.0.32/28"): route("10.8.0.32/28", "192.168.5.2", True),
    }


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
