"""CHECK: the pod is still wired as the ADD result (prevResult) says.

Checked: the pod interface (a veth, up, its MAC), its addresses, the routes
through the gateway and the gateway's neighbour entry; the node-side veth,
its label, its routes to the pod, its datapath programs and endpoint entry;
the masquerade entries; the IPAM reservation.
Routes that later plugins added are tolerated.
"""

from __future__ import annotations

from cni.datapath import endpoint_check
from cni.datapath.maps import Datapath
from cni.net import addr, link, masq, route
from cni.net.netlink import Rtnl, node_socket, pod_socket
from cni.net.netns import open_pod_netns
from cni.plugin import ipam_client, podnet
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import load_conf, refuse_without_agent
from cni.spec.attachment import Attachment
from cni.spec.errors import ERR_CHECK_FAILED, ERR_INVALID_CONFIG, CNIError
from cni.spec.protocol import Request, prev_result
from cni.spec.result import IPConfig, Result


def run(request: Request) -> None:
    conf = load_conf(request)
    refuse_without_agent(conf)
    prev = prev_result(request)
    if prev is None:
        raise CNIError(ERR_INVALID_CONFIG, "CHECK needs the ADD result as prevResult")
    with Datapath(conf.bpf_dir) as datapath:
        check(conf, request.attachment, prev, datapath=datapath)


def check(
    conf: NetConf,
    attachment: Attachment,
    prev: Result,
    *,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
) -> None:
    index, expected_ips = pod_interface(prev, attachment)
    expected = prev.interfaces[index]
    ips = [str(ip.ip) for ip in expected_ips]

    with open_pod_netns(attachment.netns) as netns, pod_socket(netns) as pod:
        check_pod(pod, attachment, expected.mac, expected_ips, prev)
    with node_socket() as node:
        check_node(node, attachment, ips, datapath)
    if conf.ip_masq:
        missing = [ip for ip in ips if not masq.contains(conf.network, ip)]
        table = masq.table_name(conf.network)
        _require(not missing, f"the masquerade set of table {table} lacks {missing}")
    with ipam_client.client(conf.ipam, conf.cni_version, allocators) as ipam:
        ipam.check(attachment, expected_ips)


def pod_interface(prev: Result, attachment: Attachment) -> tuple[int, list[IPConfig]]:
    for index, iface in enumerate(prev.interfaces):
        if iface.name == attachment.ifname and iface.sandbox == attachment.netns:
            return index, [ip for ip in prev.ips if ip.interface == index]
    raise CNIError(
        ERR_CHECK_FAILED,
        f'prevResult has no interface "{attachment.ifname}" in netns "{attachment.netns}"',
    )


def check_pod(
    pod: Rtnl, attachment: Attachment, mac: str, ips: list[IPConfig], prev: Result
) -> None:
    where = f'"{attachment.ifname}" in netns "{attachment.netns}"'
    found = link.get_link(pod, attachment.ifname)
    _require(found is not None, f"interface {where} is missing")
    assert found is not None
    _require(found.kind == "veth", f"interface {where} is a {found.kind or 'device'}, not a veth")
    _require(found.up, f"interface {where} is down")
    _require(
        not mac or found.mac.lower() == mac.lower(),
        f"interface {where} has MAC {found.mac}, prevResult says {mac}",
    )
    present = addr.addresses(pod, found.index)
    for ip in ips:
        _require(ip.address in present, f"address {ip.address} is missing on {where}")
    neighbors = addr.permanent_neighbors(pod, found.index)
    _require(
        neighbors.get(podnet.GATEWAY) == link.NODE_VETH_MAC,
        f"gateway {podnet.GATEWAY} has no permanent neighbour entry on {where}",
    )
    kernel = {(r.dst, r.gw) for r in route.routes(pod, found.index)}
    for r in prev.routes:
        if r.gw == podnet.GATEWAY:
            _require((r.dst, r.gw) in kernel, f"route {r.dst} via {r.gw} is missing on {where}")


def check_node(node: Rtnl, attachment: Attachment, ips: list[str], datapath: Datapath) -> None:
    veth = link.get_link(node, attachment.node_veth)
    _require(veth is not None, f'node-side veth "{attachment.node_veth}" is missing')
    assert veth is not None
    _require(
        veth.alias == attachment.alias,
        f'node-side veth "{veth.name}" is labelled {veth.alias!r}, not {attachment.alias!r}',
    )
    _require(veth.up, f'node-side veth "{veth.name}" is down')
    routed = set(podnet.node_routed_ips(node, veth))
    for ip in ips:
        _require(ip in routed, f'the node has no route to {ip} via "{veth.name}"')
    if ips:
        endpoint_check.check(datapath, node, veth.index, veth.name, ips)


def _require(ok: bool, details: str) -> None:
    if not ok:
        raise CNIError(ERR_CHECK_FAILED, details)
