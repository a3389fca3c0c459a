"""Who holds which pod range, as the datapath on the uplinks needs to know it.

The programs on the node's uplinks (bpf/network.h) accept a packet whose source is
a pod's from the node network only from the node that holds that pod, and the
tunnel only from its peers. They read:

- ``pod_ranges``: every other node's pod ranges with its InternalIP (what the route
  keeper routes), this node's own ranges, and the cluster's pod range as held by
  nobody known (so a source in a range no node holds is refused, not let in);
- ``tunnel_peers`` (vxlan): the InternalIPs the tunnel takes packets from;
- the neighbour table, for the link-layer address each peer sends from: the
  keeper makes each peer's entry on the interface towards it "managed" (the
  kernel keeps it resolved; protocol 115 marks it as sluice's), so that a first
  packet from a peer is never refused for want of its address. It reaches the
  table through the route keeper's ``NeighbourTable`` (cni/net/interfaces.py).

Like the routes, entries are only added and changed until the route keeper has
the full view; removals wait for it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping

from cni.datapath.maps import Datapath, PodRangeHolder
from cni.datapath.structs import RANGE_LOCAL, RANGE_UNOWNED
from cni.net.interfaces import NeighbourTable
from cni.net.peer_neighbours import NeighbourError

log = logging.getLogger("sluice.routes")

Ranges = Mapping[ipaddress.IPv4Network, ipaddress.IPv4Address]


def wanted_ranges(
    remote: Ranges,
    own: Iterable[ipaddress.IPv4Network],
    cluster: ipaddress.IPv4Network | None,
) -> dict[ipaddress.IPv4Network, PodRangeHolder]:
    """The pod_ranges map for these routes: ``remote`` (range -> holder's InternalIP),
    this node's ``own`` ranges, and the ``cluster`` range (held by nobody known)."""
    ranges = {network: PodRangeHolder(str(node)) for network, node in remote.items()}
    for network in own:
        ranges[network] = PodRangeHolder(None, RANGE_LOCAL)
    if cluster is not None and cluster not in ranges:
        ranges[cluster] = PodRangeHolder(None, RANGE_UNOWNED)
    return ranges


class PodRangeKeeper:
    """Keeps the datapath's pod_ranges and tunnel_peers and the peers' neighbours."""

    def __init__(self, datapath: Datapath, tunnel: bool) -> None:
        self.datapath = datapath
        self.tunnel = tunnel

    def update(
        self,
        neighbours: NeighbourTable,
        remote: Ranges,
        own: Iterable[ipaddress.IPv4Network],
        cluster: ipaddress.IPv4Network | None,
        complete: bool,
    ) -> None:
        wanted = wanted_ranges(remote, own, cluster)
        peers = {str(node) for node in remote.values()}
        with self.datapath.lock:
            if not complete:  # add and change only: nothing the view lacks is taken away
                wanted = {**self.datapath.network.pod_ranges(), **wanted}
                peers |= self.datapath.network.tunnel_peers()
            self.datapath.network.set_pod_ranges(wanted)
            self.datapath.network.set_tunnel_peers(peers if self.tunnel else ())
        self._manage_neighbours(neighbours, {ipaddress.IPv4Address(p) for p in peers}, complete)

    def _manage_neighbours(
        self, table: NeighbourTable, peers: set[ipaddress.IPv4Address], complete: bool
    ) -> None:
        """A managed neighbour entry for each peer on the interface the node reaches it
        through; sluice's entries for addresses no longer peers go (with the full view)."""
        found = table.neighbours()
        for peer in peers - found.managed:
            try:
                table.keep_resolved(peer)
            except NeighbourError as err:
                log.warning("failed to keep the neighbour entry of node %s resolved: %s", peer, err)
        if complete:
            for dst, ifindex in found.ours.items():
                if dst not in peers:
                    try:
                        table.forget_neighbour(dst, ifindex)
                    except NeighbourError as err:
                        log.warning("failed to remove the neighbour entry of %s: %s", dst, err)
