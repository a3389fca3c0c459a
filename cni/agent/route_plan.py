"""What the route keeper must change: the routes (and tunnel peers) the cluster asks
for, against what the kernel holds. Pure: no kernel, no API.

The rule that keeps a restart or a broken watch from cutting pods off: nothing
is removed unless the view of the cluster is ``complete`` (every watched
collection listed in full at least once). Until then only additions and changes
are made; a route of a node that is not (yet) known stays.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from cni.kube.nodes import NodeAddressing
from cni.net.peer_routes import PeerRoute
from ipam.claims import PoolBlocks

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address


class Claimed(NamedTuple):
    """A prefix a node holds (prefix mode), and the pool its claim states."""

    prefix: Network
    node: str
    pool: Network | None


class Desired(NamedTuple):
    routes: dict[Network, PeerRoute]
    # Ranges left out, with why (a claim that is no block of the pool, a range that
    # overlaps this node's own or another node's, a node whose InternalIP is a pod
    # address): reported, never routed.
    skipped: dict[Network, str]
    # This node's own ranges (its podCIDR, or the prefixes it holds).
    own: tuple[Network, ...] = ()


def desired_routes(
    nodes: Iterable[NodeAddressing],
    own_node: str,
    own_ranges: Iterable[Network],
    tunnel: bool,
    claims: Iterable[Claimed] | None = None,
    blocks: PoolBlocks | None = None,
) -> Desired:
    """One route per remote pod range via its node's InternalIP: the nodes' podCIDRs,
    or with ``claims`` (prefix mode) each prefix another node holds.

    Node objects and claims are input, not truth. A claim counts only as one block of
    the pool (``blocks``: the pool stated, the prefix inside it, of its length); any
    other (the cloud metadata address, the node network, a prefix over other nodes'
    blocks) is left out and takes no part below, so it can neither divert traffic
    nor, by overlapping, take other nodes' routes away. Node IPAM never hands out
    overlapping ranges, so two nodes' ranges that overlap (a misconfiguration, or a
    Node written to take over another's pods) are both left out, whatever their
    order; picking one would let the other's traffic go where the newcomer says. A
    node whose InternalIP is a pod address (inside any pod range) gets no route
    either: the route would hand that range's traffic to a pod."""
    by_name = {n.name: n for n in nodes}
    skipped: dict[Network, str] = {}
    ranges: list[tuple[Network, str]]
    if claims is None:
        ranges = [(cidr, n.name) for n in by_name.values() for cidr in n.pod_cidrs]
    elif blocks is None:
        raise ValueError("claims are routed only against the pool they must be blocks of")
    else:
        ranges = []
        for claim in claims:
            why = blocks.misfit(claim.prefix, claim.pool)
            if why is None:
                ranges.append((claim.prefix, claim.node))
            else:
                skipped[claim.prefix] = (
                    f"node {claim.node}'s PrefixClaim of {claim.prefix} is refused: {why}"
                )
    ranges = sorted(set(ranges), key=lambda r: (r[0], r[1]))
    own = [*own_ranges, *(dst for dst, name in ranges if name == own_node)]
    pod_ranges = [*own, *(dst for dst, _ in ranges)]
    candidates: list[tuple[Network, str, Address]] = []
    for dst, name in ranges:
        node = by_name.get(name)
        if name == own_node or node is None or node.internal_ip is None:
            continue  # this node's own, or a node without an address (yet)
        if any(dst.overlaps(o) for o in own):
            skipped[dst] = f"node {name}'s {dst} overlaps this node's own pod range"
            continue
        inside = next((r for r in pod_ranges if node.internal_ip in r), None)
        if inside is not None:
            skipped[dst] = (
                f"node {name}'s InternalIP {node.internal_ip} is a pod address (in {inside})"
            )
            continue
        candidates.append((dst, name, node.internal_ip))
    routes: dict[Network, PeerRoute] = {}
    for dst, name, gateway in candidates:
        rival = next(((d, n) for d, n, _ in candidates if n != name and d.overlaps(dst)), None)
        if rival is not None:
            skipped[dst] = (
                f"node {name}'s {dst} overlaps {rival[0]} of node {rival[1]}: neither is routed"
            )
            continue
        routes[dst] = PeerRoute(dst, gateway, tunnel)
    return Desired(routes, skipped, tuple(dict.fromkeys(own)))


class RoutePlan(NamedTuple):
    write: tuple[PeerRoute, ...]  # absent, or different in the kernel
    remove: tuple[Network, ...]  # ours, and no longer wanted
    blocked: tuple[Network, ...]  # wanted, but a route of somebody else's is there


def plan(
    desired: Mapping[Network, PeerRoute],
    present: Mapping[Network, PeerRoute],
    foreign: Iterable[Network],
    complete: bool,
) -> RoutePlan:
    foreign = set(foreign)
    write, blocked = [], []
    for dst, route in sorted(desired.items()):
        if dst in foreign and dst not in present:
            blocked.append(dst)
        elif present.get(dst) != route:
            write.append(route)
    remove = sorted(dst for dst in present if dst not in desired) if complete else []
    return RoutePlan(tuple(write), tuple(remove), tuple(blocked))


class PeerPlan(NamedTuple):
    write: tuple[Address, ...]
    remove: tuple[Address, ...]


def plan_peers(
    routes: Mapping[Network, PeerRoute],
    whole: Iterable[Address],
    partial: Iterable[Address],
    complete: bool,
) -> PeerPlan:
    """Tunnel peers: one per gateway of a tunnel route. ``whole``: peers with both
    their neighbour and FDB entries; ``partial``: peers with either. A MAC is never
    compared: it follows from the address."""
    wanted = {r.gateway for r in routes.values() if r.tunnel}
    write = sorted(wanted - set(whole))
    remove = sorted(set(partial) - wanted) if complete else []
    return PeerPlan(tuple(write), tuple(remove))
