"""GC: release everything of this network that belongs to no valid attachment.

Node-side veths are found by their alias, addresses by the IPAM store (or the
delegated IPAM's own GC), and the masquerade set is rebuilt from the veths
that remain. The datapath forgets endpoints (and their policies and flows)
whose veth is gone, whatever network they belonged to, and reaps what no
endpoint uses any more (in the agent: its reaper thread does, in the
background). Every step runs even if another fails; the errors are
reported together.
"""

from __future__ import annotations

from collections.abc import Callable

from cni.datapath import bpf, endpoint, reaper
from cni.datapath.endpoint import DatapathEndpoints
from cni.datapath.maps import Datapath, DatapathMissing
from cni.net import masq
from cni.net.netlink import node_socket
from cni.plugin import ipam_client, podnet
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import load_conf
from cni.plugin.verbs.delete import forget_connections
from cni.spec.errors import ERR_KERNEL, CNIError
from cni.spec.log import logger
from cni.spec.protocol import Request, valid_attachments

log = logger("sluice")


def run(request: Request) -> None:
    valid = valid_attachments(request.config)
    conf = load_conf(request)
    with Datapath(conf.bpf_dir) as datapath:
        gc(conf, valid, datapath=datapath)


def gc(
    conf: NetConf,
    valid: set[tuple[str, str]],
    *,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
) -> None:
    errors: list[CNIError] = []
    remaining_ips: list[str] = []
    gone_ips: list[str] = []
    with node_socket() as node:
        for key, veth in podnet.node_veths(node, conf.network).items():
            if key in valid:
                remaining_ips += podnet.node_routed_ips(node, veth)
                continue
            try:
                ips = podnet.node_routed_ips(node, veth)
                gone_ips += ips
                podnet.disconnect(node, veth, DatapathEndpoints(datapath), ips)
                log.info("gc: removed veth %s of %s/%s", veth.name, *key)
            except CNIError as err:
                errors.append(err)
    steps: list[Callable[[], object]] = [
        lambda: forget_connections(gone_ips),
        lambda: _ipam_gc(conf, valid, allocators),
        lambda: _resync_masquerade(conf, remaining_ips),
        lambda: endpoint.sweep(datapath, endpoint.live_ifindexes()),
        lambda: _reap(datapath),
    ]
    for step in steps:
        try:
            step()
        except CNIError as err:
            errors.append(err)
    if errors:
        raise CNIError(errors[0].code, "; ".join(err.details for err in errors))


def _ipam_gc(
    conf: NetConf, valid: set[tuple[str, str]], allocators: ipam_client.KeptAllocators | None
) -> None:
    with ipam_client.client(conf.ipam, conf.cni_version, allocators) as ipam:
        ipam.gc(valid)


def _reap(datapath: Datapath) -> None:
    try:
        reaper.collect(datapath)
    except DatapathMissing:
        return  # nothing was ever loaded here
    except bpf.BPFError as err:
        raise CNIError(ERR_KERNEL, f"failed to reap the datapath's garbage: {err}") from None


def _resync_masquerade(conf: NetConf, remaining_ips: list[str]) -> None:
    if not conf.ip_masq:
        return
    if remaining_ips:
        masq.replace(conf.network, conf.cluster_cidr, remaining_ips)
    else:
        masq.drop(conf.network)
