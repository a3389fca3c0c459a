"""Pod wiring: the veth pair, the pod's addresses and routes, the node's routes.

The pod's default route points at a link-local gateway, 169.254.1.1, which no
interface owns: the pod has a permanent neighbour entry mapping it to the
node-side veth's fixed MAC, so every packet the pod routes goes to the node,
which forwards it by its /32 host routes. Pod addresses keep their subnet's
prefix length but get no on-link route (IFA_F_NOPREFIXROUTE), so pod-to-pod
traffic on a node also goes through the node, keeping its source address.
The node-side veth has no address; traffic from the node to a pod leaves
with the node's own address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cni.datapath import endpoint
from cni.net import addr, link, route
from cni.net.netlink import IPRoute
from cni.net.netns import Netns
from cni.protocol import Request
from cni.result import Route

GATEWAY = "169.254.1.1"
DEFAULT_ROUTE = "0.0.0.0/0"
DEFAULT_MTU = 1500


@dataclass(frozen=True)
class Attachment:
    """One (network, container id, ifname) and the node-side veth that serves it."""

    network: str
    container_id: str
    ifname: str

    @classmethod
    def of(cls, request: Request) -> Attachment:
        return cls(request.network, request.container_id, request.ifname)

    @property
    def node_veth(self) -> str:
        return link.node_veth_name(self.container_id, self.ifname)

    @property
    def alias(self) -> str:
        return link.attachment_alias(self.network, self.container_id, self.ifname)


def pod_routes(ipam_routes: list[Route]) -> list[Route]:
    """IPAM routes sent through the gateway, with a default route when none is given."""
    routes = [
        Route(dst=r.dst, gw=GATEWAY, mtu=r.mtu, advmss=r.advmss, priority=r.priority, table=r.table)
        for r in ipam_routes
        if ipaddress.ip_network(r.dst, strict=False).version == 4
    ]
    if not any(r.dst == DEFAULT_ROUTE for r in routes):
        routes.insert(0, Route(dst=DEFAULT_ROUTE, gw=GATEWAY))
    return routes


def wire(
    node: IPRoute,
    pod: IPRoute,
    netns: Netns,
    attachment: Attachment,
    mtu: int,
    pod_mac: str | None,
    addresses: list[str],
    routes: list[Route],
    bpf_dir: str,
) -> tuple[link.Link, link.Link]:
    """Create and configure the pair; return the (node-side, pod-side) links.

    The datapath is attached to the node-side veth before either end is up,
    so no packet ever crosses the pair unjudged.
    """
    ifname = attachment.ifname
    link.create_veth(node, attachment.node_veth, attachment.alias, ifname, netns.fd, mtu, pod_mac)
    pod_link = link.get_link(pod, ifname)
    node_link = link.get_link(node, attachment.node_veth)
    if pod_link is None or node_link is None:
        raise RuntimeError(f"veth {attachment.node_veth}/{ifname} vanished after creation")
    pod_ips = [str(ipaddress.ip_interface(a).ip) for a in addresses]
    endpoint.attach(node, node_link.index, node_link.name, pod_ips, bpf_dir)

    for cidr in addresses:
        addr.add_address(pod, pod_link.index, ifname, cidr)
    link.set_up(pod, pod_link.index, ifname)
    route.add_route(pod, pod_link.index, ifname, Route(dst=f"{GATEWAY}/32"))
    addr.add_permanent_neighbor(pod, pod_link.index, ifname, GATEWAY, link.NODE_VETH_MAC)
    for r in routes:
        route.add_route(pod, pod_link.index, ifname, r)

    link.set_up(node, node_link.index, node_link.name)
    for cidr in addresses:
        route.add_route_to_pod(
            node, node_link.index, attachment.node_veth, str(ipaddress.ip_interface(cidr).ip)
        )
    return node_link, pod_link


def node_routed_ips(node: IPRoute, node_link: link.Link) -> list[str]:
    """Pod addresses the node routes through this veth (its /32 host routes)."""
    return [
        r.dst.split("/")[0] for r in route.routes(node, node_link.index) if r.dst.endswith("/32")
    ]


def pod_routed_to(node: IPRoute, ip: str) -> str | None:
    """The alias of the sluice veth the node routes ``ip`` to, if any."""
    for msg in node.route("get", dst=ip):
        oif = msg.get("RTA_OIF")
        if oif:
            (dev,) = node.link("get", index=oif)
            alias = dev.get("IFLA_IFALIAS")
            if link.parse_alias(alias):
                return alias
    return None


def unwire(node: IPRoute, attachment: Attachment, bpf_dir: str) -> list[str]:
    """Delete the pair (the pod end goes with it), then forget the endpoint, so the
    pair is never up and unfiltered; return the pod addresses it carried. A veth
    labelled for another network is left alone.
    """
    node_link = link.get_link(node, attachment.node_veth)
    if node_link is None:
        # Deleted behind our back: its ifindex is unknown, so drop every endpoint
        # whose veth no longer exists.
        endpoint.sweep(bpf_dir, endpoint.live_ifindexes())
        return []
    owner = link.parse_alias(node_link.alias)
    if owner is not None and owner[0] != attachment.network:
        return []
    ips = node_routed_ips(node, node_link)
    link.delete_link(node, attachment.node_veth)
    endpoint.detach(node_link.index, bpf_dir)
    return ips
