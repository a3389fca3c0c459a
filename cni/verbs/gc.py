"""GC: release everything of this network that belongs to no valid attachment.

Node-side veths are found by their alias, addresses by the IPAM store (or the
delegated IPAM's own GC), and the masquerade set is rebuilt from the veths
that remain. The datapath forgets endpoints (and their policies and flows)
whose veth is gone, whatever network they belonged to. Every step runs even
if another fails; the errors are reported together.
"""

from __future__ import annotations

import logging

from cni import ipam_client, wiring
from cni.datapath import endpoint
from cni.errors import CNIError
from cni.net import link, masq
from cni.net.netlink import IPRoute
from cni.netconf import NetConf
from cni.protocol import Request, valid_attachments
from cni.verbs import load_conf

log = logging.getLogger("sluice")


def run(request: Request) -> None:
    valid = valid_attachments(request.config)
    conf = load_conf(request)
    errors: list[CNIError] = []
    remaining_ips: list[str] = []
    with IPRoute() as node:
        for veth, container_id, ifname in link.attachment_links(node, conf.network):
            if (container_id, ifname) in valid:
                remaining_ips += wiring.node_routed_ips(node, veth)
                continue
            try:
                link.delete_link(node, veth.name)
                endpoint.detach(veth.index, conf.bpf_dir)
                log.info("gc: removed veth %s of %s/%s", veth.name, container_id, ifname)
            except CNIError as err:
                errors.append(err)
    for step in (
        lambda: ipam_client.for_request(request).gc(valid),
        lambda: _resync_masquerade(conf, remaining_ips),
        lambda: endpoint.sweep(conf.bpf_dir, endpoint.live_ifindexes()),
    ):
        try:
            step()
        except CNIError as err:
            errors.append(err)
    if errors:
        raise CNIError(errors[0].code, "; ".join(err.details for err in errors))


def _resync_masquerade(conf: NetConf, remaining_ips: list[str]) -> None:
    if not conf.ip_masq or conf.cluster_cidr is None:
        return
    if remaining_ips:
        masq.replace(conf.network, conf.cluster_cidr, remaining_ips)
    else:
        masq.drop(conf.network)
