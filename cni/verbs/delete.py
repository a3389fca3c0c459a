"""DEL: remove the pod's veth, its masquerade entry and its address.

DEL never enters the pod's namespace: the node-side veth is found by its
name, and deleting it removes the pod end too. So it succeeds when the
namespace is gone, when CNI_NETNS is empty, when it is repeated, and when no
ADD ever happened. Kernel state goes first and the address last, so an
address is never free while a route to it still exists.
"""

from __future__ import annotations

from cni import ipam_client, wiring
from cni.net import masq
from cni.net.netlink import IPRoute
from cni.protocol import Request, prev_result
from cni.verbs import load_conf


def run(request: Request) -> None:
    conf = load_conf(request)
    attachment = wiring.Attachment.of(request)
    ipam = ipam_client.for_request(request)
    with IPRoute() as node:
        ips = set(wiring.unwire(node, attachment, conf.bpf_dir)) | set(ipam.addresses())
        # prevResult may be stale (a late DEL): skip an address another pod now has.
        ips.update(
            ip
            for ip in prev_ips(request)
            if ip not in ips and wiring.pod_routed_to(node, ip) is None
        )
    if conf.ip_masq and ips:
        masq.remove(conf.network, sorted(ips))
    ipam.delete()


def prev_ips(request: Request) -> list[str]:
    """Addresses prevResult gives the pod interface (used when the veth is already gone)."""
    try:
        prev = prev_result(request)
    except Exception:  # DEL is best effort: a broken prevResult must not block it
        return []
    if prev is None:
        return []
    indexes = {
        i
        for i, iface in enumerate(prev.interfaces)
        if iface.name == request.ifname and iface.sandbox
    }
    return [str(ip.ip) for ip in prev.ips if ip.interface in indexes and ip.version == 4]
