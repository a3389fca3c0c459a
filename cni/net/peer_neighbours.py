"""The other nodes' neighbour entries, kept resolved (pyroute2; the agent's path only).

Each peer's entry, on the interface the node reaches it through, is "managed" (the
kernel keeps it resolved) and carries the route keeper's ``PROTOCOL``, so that the
agent finds its own entries again and removes nobody else's.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import NamedTuple

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni.net.peer_routes import PROTOCOL

NTF_EXT_MANAGED = 1 << 0  # NDA_FLAGS_EXT: the kernel keeps the entry resolved
NUD_NONE = 0x00


class NeighbourError(Exception):
    """The kernel refused a neighbour entry (or had no single route to the node)."""


class Neighbours(NamedTuple):
    ours: dict[ipaddress.IPv4Address, int]  # entries of PROTOCOL: address -> ifindex
    managed: set[ipaddress.IPv4Address]  # entries kept resolved, whoever made them


def neighbours(ipr: IPRoute) -> Neighbours:
    """The IPv4 neighbour table, as far as the peers' entries go."""
    found = Neighbours({}, set())
    for msg in ipr.get_neighbours(family=socket.AF_INET):
        dst = msg.get_attr("NDA_DST")
        if dst is None:
            continue
        address = ipaddress.IPv4Address(dst)
        if msg.get_attr("NDA_PROTOCOL") == PROTOCOL:
            found.ours[address] = msg["ifindex"]
        if (msg.get_attr("NDA_FLAGS_EXT") or 0) & NTF_EXT_MANAGED:
            found.managed.add(address)
    return found


def keep_resolved(ipr: IPRoute, node: ipaddress.IPv4Address) -> None:
    """A managed entry for ``node`` on the interface its route goes out of."""
    try:
        (route,) = ipr.route("get", dst=str(node))
        ipr.neigh(
            "replace",
            dst=str(node),
            ifindex=route.get_attr("RTA_OIF"),
            state=NUD_NONE,
            NDA_FLAGS_EXT=NTF_EXT_MANAGED,
            NDA_PROTOCOL=PROTOCOL,
        )
    except (NetlinkError, ValueError) as err:
        raise NeighbourError(str(err)) from None


def forget(ipr: IPRoute, node: ipaddress.IPv4Address, ifindex: int) -> None:
    """Delete the entry of ``node`` on ``ifindex``."""
    try:
        ipr.neigh("del", dst=str(node), ifindex=ifindex)
    except NetlinkError as err:
        raise NeighbourError(str(err)) from None
