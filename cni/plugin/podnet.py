"""Pod wiring: the veth pair, the pod's addresses and routes, the node's routes,
and the datapath on the node-side veth.

The pod's default route points at a link-local gateway, 169.254.1.1, which no
interface owns: the pod has a permanent neighbour entry mapping it to the
node-side veth's fixed MAC, so every packet the pod routes goes to the node,
which forwards it by its /32 routes to pods. Pod addresses keep their subnet's
prefix length but get no on-link route (IFA_F_NOPREFIXROUTE), so pod-to-pod
traffic on a node also goes through the node, keeping its source address.
The node-side veth has no address; traffic from the node to a pod leaves
with the node's own address.

ADD takes three steps here, in this order (``cni/plugin/verbs/add.py``):
``create_pair`` (a ``VethPlan`` in, a ``MadePair`` out, its programs
attaching meanwhile), ``register`` (the endpoint's entries, once its
``Addressing`` is known) and ``bring_up``; ``remove_pair`` undoes all three.
Everything takes plain values and the datapath as an ``EndpointRegistry``
(``cni.datapath.interfaces``): on a node, ``DatapathEndpoints`` over the open
datapath handle of the caller's process.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections.abc import Callable
from typing import NamedTuple

from cni.datapath import endpoint
from cni.datapath.interfaces import EndpointRegistry
from cni.net import addr, link, route
from cni.net.netlink import Rtnl
from cni.net.route import RouteSpec
from cni.spec.attachment import ALIAS_PREFIX, parse_alias

GATEWAY = "169.254.1.1"
DEFAULT_ROUTE = "0.0.0.0/0"
DEFAULT_MTU = 1500


class VethPair(NamedTuple):
    """The names of a pod's veth pair."""

    node_veth: str  # on the node
    alias: str  # the node-side veth's label
    pod_ifname: str  # inside the pod's namespace


class VethPlan(NamedTuple):
    """The pair to make: its names, MTU, the pod end's MAC (None: the kernel's) and
    how the programs attach (tcx, else tc)."""

    pair: VethPair
    mtu: int
    pod_mac: str | None
    tcx: bool


class Addressing(NamedTuple):
    """The pod's addresses (CIDRs, the subnet's prefix length) and its routes."""

    addresses: list[str]
    routes: list[RouteSpec]

    @property
    def ips(self) -> list[str]:
        return [str(ipaddress.ip_interface(cidr).ip) for cidr in self.addresses]


def pod_routes(requested: list[RouteSpec]) -> list[RouteSpec]:
    """Requested IPv4 routes sent through the gateway, with a default route when none is."""
    routes = [
        r._replace(gw=GATEWAY, scope=None)
        for r in requested
        if ipaddress.ip_network(r.dst, strict=False).version == 4
    ]
    if not any(r.dst == DEFAULT_ROUTE for r in routes):
        routes.insert(0, RouteSpec(dst=DEFAULT_ROUTE, gw=GATEWAY))
    return routes


class MadePair(NamedTuple):
    plan: VethPlan
    ifindex: int  # the node-side veth's
    attaching: Attaching


def create_pair(
    node: Rtnl, pod: Rtnl, pod_netns_fd: int, veth: VethPlan, endpoints: EndpointRegistry
) -> MadePair:
    """Create the pair, both ends down, and start attaching the programs to its node
    end.

    Every netlink request (even a read) waits while an attach holds the RTNL
    lock, so the caller does its other work before it asks netlink anything."""
    pair = veth.pair
    node_index = link.create_veth(
        node, pair.node_veth, pair.alias, pair.pod_ifname, pod_netns_fd, veth.mtu, veth.pod_mac
    )
    # Before the attach: the kernel takes the RTNL lock for disable_ipv6 by trylock,
    # restarting the write in a busy loop while an attach holds it.
    endpoint.no_ipv6_from_pod(pair.node_veth)
    return MadePair(veth, node_index, Attaching(endpoints, node_index, pair.node_veth, veth.tcx))


class Attaching:
    """The datapath's programs being attached to a new node-side veth in a thread of
    their own: each tcx link makes the kernel wait for an RCU grace period (about
    11 ms, holding the RTNL lock), time in which ADD allocates the address,
    registers the endpoint and installs its policy. ``wait`` before the pair goes up."""

    def __init__(
        self, endpoints: EndpointRegistry, ifindex: int, name: str, tcx: bool = True
    ) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(endpoints, ifindex, name, tcx),
            name=f"attach-{name}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, endpoints: EndpointRegistry, ifindex: int, name: str, tcx: bool) -> None:
        try:
            endpoints.attach(ifindex, name, tcx)
        except BaseException as err:  # handed to wait()
            self.error = err

    def wait(self) -> None:
        """Return once the programs are attached; raise what stopped them."""
        self._thread.join()
        if self.error is not None:
            raise self.error


def register(endpoints: EndpointRegistry, made: MadePair, addressing: Addressing) -> None:
    """The endpoint's entries (its addresses: any other source is spoofed), while the
    programs attach; ``remove_pair`` removes them with the pair."""
    endpoints.register(made.ifindex, made.plan.pair.node_veth, addressing.ips)


def bring_up(
    node: Rtnl, pod: Rtnl, made: MadePair, addressing: Addressing
) -> tuple[link.Link, link.Link]:
    """Address the pod end, wait for the programs, bring the pair up with its routes;
    return its (node-side, pod-side) links. The caller has registered the endpoint
    and installed its policy: no packet ever crosses the pair unjudged."""
    pair = made.plan.pair
    ifname = pair.pod_ifname
    pod_link = link.get_link(pod, ifname)
    node_link = link.link_by_index(node, made.ifindex)
    if pod_link is None or node_link is None:
        raise RuntimeError(f"veth {pair.node_veth}/{ifname} vanished after creation")
    for cidr in addressing.addresses:
        addr.add_address(pod, pod_link.index, ifname, cidr)
    made.attaching.wait()

    link.set_up(pod, pod_link.index, ifname)
    route.add_route(pod, pod_link.index, ifname, RouteSpec(dst=f"{GATEWAY}/32"))
    addr.add_permanent_neighbor(pod, pod_link.index, ifname, GATEWAY, link.NODE_VETH_MAC)
    for r in addressing.routes:
        route.add_route(pod, pod_link.index, ifname, r)

    link.set_up(node, node_link.index, node_link.name)
    for ip in addressing.ips:
        route.add_route_to_pod(node, node_link.index, node_link.name, ip)
    return node_link, pod_link


def remove_pair(node: Rtnl, made: MadePair, endpoints: EndpointRegistry, ips: list[str]) -> None:
    """Undo ``create_pair``, ``register`` and ``bring_up``: once the programs' attach
    is over (never remove a veth a thread still works on), the pair, its routes
    and its endpoint go. ``ips``: the pod's addresses, if it got them."""
    with contextlib.suppress(BaseException):
        made.attaching.wait()
    veth = link.get_link(node, made.plan.pair.node_veth)
    if veth is None:
        return
    disconnect(node, veth, endpoints, sorted({*ips, *node_routed_ips(node, veth)}))


def node_routed_ips(node: Rtnl, node_link: link.Link) -> list[str]:
    """Pod addresses the node routes through this veth (its /32 routes to pods)."""
    return [
        r.dst.split("/")[0] for r in route.routes(node, node_link.index) if r.dst.endswith("/32")
    ]


def routed_alias(node: Rtnl, ip: str) -> str | None:
    """The alias of the link the node routes ``ip`` to, if it has one."""
    oif = route.output_interface(node, ip)
    found = link.link_by_index(node, oif) if oif else None
    return found.alias if found else None


def disconnect(
    node: Rtnl,
    node_veth: link.Link | None,
    endpoints: EndpointRegistry,
    ips: list[str] | None = None,
) -> None:
    """Delete the pair (the pod end goes with it), then forget the endpoint, so the
    pair is never up and unfiltered (``ips``: its addresses, if known)."""
    if node_veth is None:
        # Deleted behind our back: its ifindex is unknown. The endpoints that the
        # pod's addresses still name go if their veth is gone; knowing no address,
        # every endpoint whose veth no longer exists does.
        if ips:
            endpoints.forget_gone(ips)
        else:
            endpoints.sweep_gone()
        return
    link.delete_link(node, node_veth.name)
    endpoints.detach(node_veth.index, ips)


def cut_off(
    node: Rtnl, node_veth: link.Link, endpoints: EndpointRegistry, ips: list[str]
) -> Callable[[], None]:
    """Take the pair out of service now and return what deletes it.

    Deleting a veth makes the caller wait for the kernel's RCU callbacks (20 to
    45 ms, longer with tcx links), which nothing of DEL's contract needs: taking
    the node end down stops the pair (a veth carries nothing unless both ends
    are up) and makes the kernel drop the node's routes through it at once, and
    without its endpoint entry the programs drop anything left. The returned
    function deletes the veth (by ifindex, so never a newer one of the same
    name), then releases its links. ``ips``: the addresses the node routes to it."""
    link.set_down(node, node_veth.index, node_veth.name)
    endpoints.forget(node_veth.index, ips)

    def finish() -> None:
        with Rtnl() as rtnl:
            link.delete_link_index(rtnl, node_veth.index, node_veth.name)
        endpoints.release_links(node_veth.index)

    return finish


def node_veths(node: Rtnl, network: str) -> dict[tuple[str, str], link.Link]:
    """The network's node-side veths by (container id, ifname), found by their alias."""
    found = {}
    for veth in link.links_with_alias(node, ALIAS_PREFIX):
        owner = parse_alias(veth.alias)
        if owner and owner[0] == network:
            found[(owner[1], owner[2])] = veth
    return found
