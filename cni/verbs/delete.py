"""DEL: remove the pod's veth, its masquerade entry and its address.

DEL never enters the pod's namespace: the node-side veth is found by its
name, and deleting it removes the pod end too. So it succeeds when the
namespace is gone, when CNI_NETNS is empty, when it is repeated, and when no
ADD ever happened. Kernel state goes first and the address last, so an
address is never free while a route to it still exists.

A long-lived caller (the agent) may pass ``defer``: the pair is then only cut
off (down, unrouted, its endpoint forgotten) before the address goes, and the
veth's deletion, which waits for the kernel's RCU callbacks, is handed to
``defer`` to run after DEL has answered.
"""

from __future__ import annotations

from collections.abc import Callable

from cni import ipam_client, wiring
from cni.attachment import Attachment, parse_alias
from cni.log import logger
from cni.net import conntrack, link, masq
from cni.net.netlink import Rtnl, node_socket
from cni.netconf import NetConf
from cni.protocol import Request, prev_result
from cni.result import Result
from cni.verbs import load_conf

log = logger("sluice")

# Takes the function that deletes a cut-off pair and runs it later.
Defer = Callable[[Callable[[], None]], None]


def run(request: Request) -> None:
    conf = load_conf(request)
    try:
        prev = prev_result(request)
    except Exception:  # DEL is best effort: a broken prevResult must not block it
        prev = None
    delete(conf, request.attachment, prev)


def delete(
    conf: NetConf,
    attachment: Attachment,
    prev: Result | None = None,
    *,
    defer: Defer | None = None,
) -> None:
    with ipam_client.client(conf.ipam, conf.cni_version) as ipam:
        _delete(conf, attachment, prev, ipam, defer)


def _delete(
    conf: NetConf,
    attachment: Attachment,
    prev: Result | None,
    ipam: ipam_client.IPAM,
    defer: Defer | None,
) -> None:
    ips = set(ipam.addresses(attachment))
    with node_socket() as node:
        veth = link.get_link(node, attachment.node_veth)
        owner = parse_alias(veth.alias) if veth else None
        if owner is not None and owner[0] != attachment.network:
            veth = None  # a veth of another network with this name: not ours to touch
        if veth is not None and not ips:
            ips.update(wiring.node_routed_ips(node, veth))  # a delegated IPAM: ask the kernel
        if veth is not None and defer is not None:
            defer(wiring.cut_off(node, veth, conf.bpf_dir))
        else:
            wiring.unwire(node, veth, conf.bpf_dir)
        # prevResult may be stale (a late DEL): skip an address another pod now has.
        ips.update(ip for ip in prev_ips(prev, attachment) if not _routed_elsewhere(node, ip))
    if conf.ip_masq:
        masq.remove(conf.network, sorted(ips))
    forget_connections(sorted(ips))
    ipam.delete(attachment)


def forget_connections(ips: list[str]) -> None:
    """The kernel's conntrack entries of the pod's addresses go before the addresses
    do, so none applies to the pod that gets one next."""
    try:
        conntrack.forget(ips)
    except OSError as err:  # DEL must not fail over what a later DEL cannot fix either
        log.warning("failed to forget the connections of %s: %s", ips, err)


def _routed_elsewhere(node: Rtnl, ip: str) -> bool:
    return parse_alias(wiring.routed_alias(node, ip)) is not None


def prev_ips(prev: Result | None, attachment: Attachment) -> list[str]:
    """Addresses prevResult gives the pod interface (used when the veth is already gone)."""
    if prev is None:
        return []
    indexes = {
        i
        for i, iface in enumerate(prev.interfaces)
        if iface.name == attachment.ifname and iface.sandbox
    }
    return [str(ip.ip) for ip in prev.ips if ip.interface in indexes and ip.version == 4]
