"""DEL: remove the pod's veth, its masquerade entry and its address.

DEL never enters the pod's namespace: the node-side veth is found by its
name, and deleting it removes the pod end too. So it succeeds when the
namespace is gone, when CNI_NETNS is empty, when it is repeated, and when no
ADD ever happened. Kernel state goes first and the address last, so an
address is never free while a route to it still exists.

A long-lived caller (the agent) may pass ``defer``: DEL then first cuts the
pair off (down, so the kernel drops the node's routes through it, and its
endpoint forgotten, so its programs drop anything left) and hands what is
slow to ``defer``, to run after DEL has answered. In a network whose policy
is enforced, only the agent ever wires pods, so a down veth there can only
be an unfinished DEL (or a failed ADD, which is deleted anyway); everything
after the cut-off is deferred, in the order above, the veth last. Until
then the address stays allocated, so no other pod can get it, and were the
agent to die in between, the down veth marks the unfinished DEL:
``finish_cut_off`` (the agent at start), the attachment's next ADD, or GC
completes it. In other networks an in-process ADD may be making a down pair
at any moment, so the release runs before DEL answers and only the veth's
deletion (which waits for the kernel's RCU callbacks) is deferred.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from cni.datapath.endpoint import DatapathEndpoints
from cni.datapath.maps import Datapath
from cni.net import conntrack, link, masq
from cni.net.netlink import Rtnl, node_socket
from cni.plugin import ipam_client, podnet
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import load_conf
from cni.spec.attachment import Attachment, parse_alias
from cni.spec.log import logger
from cni.spec.protocol import Request, prev_result
from cni.spec.result import Result

log = logger("sluice")

# Takes what DEL leaves for after its answer and runs it then: the release (None
# when DEL made it itself), and after it the veth's deletion (not if the release failed).
Defer = Callable[[Callable[[], None] | None, Callable[[], None]], None]


def run(request: Request) -> None:
    conf = load_conf(request)
    try:
        prev = prev_result(request)
    except Exception:  # DEL is best effort: a broken prevResult must not block it
        prev = None
    with Datapath(conf.bpf_dir) as datapath:
        delete(conf, request.attachment, prev, datapath=datapath)


def delete(
    conf: NetConf,
    attachment: Attachment,
    prev: Result | None = None,
    *,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
    defer: Defer | None = None,
) -> None:
    """``datapath``: the process's handle on the network's datapath (``defer``red work
    uses it too, so it must stay open until that has run); ``allocators``: the IPAM
    allocators a long-lived caller keeps open."""

    def release(routed: list[str] | None) -> None:
        _release(conf, attachment, prev, routed, datapath, allocators)

    cut = _cut_off(attachment, datapath) if defer is not None else None
    if defer is None or cut is None:
        release(None)  # the veth, if any, goes first, then everything else
    elif conf.policy == "enforce":
        defer(lambda: release(cut.routed), cut.delete_veth)
    else:
        release(cut.routed)
        defer(None, cut.delete_veth)


class CutOff(NamedTuple):
    routed: list[str]  # the addresses the node routed to the pair
    delete_veth: Callable[[], None]


def _cut_off(attachment: Attachment, datapath: Datapath) -> CutOff | None:
    """The attachment's pair out of service (down, its endpoint forgotten), or None
    if it has no veth of this network."""
    with node_socket() as node:
        veth = _own_veth(node, attachment)
        if veth is None:
            return None
        # A delegated IPAM's addresses are known only from the node's routes, which
        # the kernel drops once the veth is down.
        routed = podnet.node_routed_ips(node, veth)
        return CutOff(routed, podnet.cut_off(node, veth, DatapathEndpoints(datapath), routed))


def finish_cut_off(
    conf: NetConf,
    attachment: Attachment,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
) -> None:
    """Complete a DEL whose pair was cut off but whose release never ran (its
    caller died in between): the same release, found from the down veth."""
    delete(conf, attachment, datapath=datapath, allocators=allocators, defer=_finish_now)


def _finish_now(release: Callable[[], None] | None, delete_veth: Callable[[], None]) -> None:
    """The release, then the veth: should the release fail, the down veth still marks
    the DEL as unfinished."""
    if release is not None:
        release()
    delete_veth()


def _release(
    conf: NetConf,
    attachment: Attachment,
    prev: Result | None,
    routed: list[str] | None,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None,
) -> None:
    """Everything DEL removes once the pair is out of service (``routed``: the
    addresses the node routed to it), or with the pair (None: the veth, if any, is
    deleted here first)."""
    with ipam_client.client(conf.ipam, conf.cni_version, allocators) as ipam:
        held = ipam.addresses(attachment)
        with node_socket() as node:
            if routed is None:
                routed = _remove_veth(node, attachment, datapath, held)
            ips = set(held or routed)  # a delegated IPAM's: those routed to the pod
            # prevResult may be stale (a late DEL): skip an address another pod now has.
            ips.update(ip for ip in prev_ips(prev, attachment) if not _routed_elsewhere(node, ip))
        if conf.ip_masq:
            masq.remove(conf.network, sorted(ips))
        forget_connections(sorted(ips))
        ipam.delete(attachment)


def _remove_veth(
    node: Rtnl, attachment: Attachment, datapath: Datapath, held: list[str]
) -> list[str]:
    """Delete the attachment's pair and forget its endpoint (also one whose veth is
    already gone); return the addresses the node routed to it."""
    veth = _own_veth(node, attachment)
    routed = podnet.node_routed_ips(node, veth) if veth is not None else []
    podnet.disconnect(node, veth, DatapathEndpoints(datapath), sorted({*held, *routed}))
    return routed


def _own_veth(node: Rtnl, attachment: Attachment) -> link.Link | None:
    """The attachment's node-side veth, unless a veth of another network has its name
    (not ours to touch)."""
    veth = link.get_link(node, attachment.node_veth)
    owner = parse_alias(veth.alias) if veth else None
    if owner is not None and owner[0] != attachment.network:
        return None
    return veth


def forget_connections(ips: list[str]) -> None:
    """The kernel's conntrack entries of the pod's addresses go before the addresses
    do, so none applies to the pod that gets one next."""
    try:
        conntrack.forget(ips)
    except OSError as err:  # DEL must not fail over what a later DEL cannot fix either
        log.warning("failed to forget the connections of %s: %s", ips, err)


def _routed_elsewhere(node: Rtnl, ip: str) -> bool:
    return parse_alias(podnet.routed_alias(node, ip)) is not None


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
