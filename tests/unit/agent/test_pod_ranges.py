"""The pod_ranges map the uplinks read: each other node's ranges with its address, this
node's own and the cluster range flagged, so that no pod source is taken from the
network unless its holder sent it."""

from __future__ import annotations

import ipaddress

from cni.agent.pod_ranges import wanted_ranges
from cni.datapath.maps import PodRangeHolder
from cni.datapath.structs import RANGE_LOCAL, RANGE_UNOWNED

net, addr = ipaddress.IPv4Network, ipaddress.IPv4Address


def test_remote_ranges_name_their_node_and_own_and_cluster_ranges_are_flagged() -> None:
    wanted = wanted_ranges(
        {net("10.244.2.0/24"): addr("172.18.0.3"), net("10.244.3.0/28"): addr("172.18.0.4")},
        [net("10.244.1.0/24")],
        net("10.244.0.0/16"),
    )
    assert wanted == {
        net("10.244.2.0/24"): PodRangeHolder("172.18.0.3"),
        net("10.244.3.0/28"): PodRangeHolder("172.18.0.4"),
        net("10.244.1.0/24"): PodRangeHolder(None, RANGE_LOCAL),
        net("10.244.0.0/16"): PodRangeHolder(None, RANGE_UNOWNED),
    }


def test_a_cluster_range_that_is_the_nodes_own_stays_local() -> None:
    """A single node's cluster range defaults to its own subnet."""
    own = net("10.244.0.0/24")
    assert wanted_ranges({}, [own], own) == {own: PodRangeHolder(None, RANGE_LOCAL)}
    assert wanted_ranges({}, [], None) == {}
