"""ADD: allocate the pod's address, wire its veth, masquerade, report the result.

Every step after the IPAM allocation is undone if a later one fails (or the
process is told to stop), so a failed ADD leaves no veth, route, masquerade
entry or address behind.
"""

from __future__ import annotations

import logging
import re
import signal
from typing import Any

from cni import ipam_client, wiring
from cni.datapath import loader
from cni.errors import (
    ERR_INVALID_CONFIG,
    ERR_INVALID_ENV,
    ERR_TRY_AGAIN,
    ERR_UNSUPPORTED_FIELD,
    CNIError,
)
from cni.net import link, masq, sysctl
from cni.net.netlink import IPRoute, pod_socket
from cni.net.netns import Netns, NetnsGone, NotANetns
from cni.protocol import Request, prev_result
from cni.result import Interface, IPConfig, Result
from cni.verbs import load_conf, require_standalone

log = logging.getLogger("sluice")
MAC_PATTERN = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


def run(request: Request) -> dict[str, Any]:
    conf = load_conf(request)
    require_standalone(conf)
    if conf.ip_masq and conf.cluster_cidr is None:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f'"ipMasq" needs "clusterCIDR" when the IPAM ({conf.ipam_type}) has no "subnet"',
        )
    prev = prev_result(request)
    pod_mac = requested_mac(request)
    stop = StopRequest()

    attachment = wiring.Attachment.of(request)
    with open_pod_netns(request.netns) as netns, IPRoute() as node, pod_socket(netns) as pod:
        if link.get_link(pod, request.ifname) is not None:
            raise CNIError(
                ERR_INVALID_ENV,
                f'interface "{request.ifname}" already exists in netns "{request.netns}"',
            )
        remove_leftover_veth(node, attachment, conf.bpf_dir)
        mtu = conf.mtu or link.default_route_mtu(node) or wiring.DEFAULT_MTU
        # Compiles only if nothing is pinned yet ("policy": "off" without an agent).
        loader.ensure_loaded(conf.bpf_dir)
        ipam = ipam_client.for_request(request)
        stop.check()
        ipam_result, allocated = ipam.add()
        try:
            stop.check()
            addresses = pod_addresses(ipam_result)
            routes = wiring.pod_routes(ipam_result.routes)
            sysctl.ensure("net.ipv4.ip_forward", "1")
            node_link, pod_link = wiring.wire(
                node, pod, netns, attachment, mtu, pod_mac, addresses, routes, conf.bpf_dir
            )
            stop.check()
            if conf.ip_masq and conf.cluster_cidr is not None:
                masq.add(conf.network, conf.cluster_cidr, [a.split("/")[0] for a in addresses])
        except BaseException:
            stop.ignore()
            rollback(node, attachment, ipam, allocated, conf.bpf_dir)
            raise
    stop.ignore()  # the pod is wired: finish and report it

    ours = Result(
        request.cni_version,
        interfaces=[
            Interface(node_link.name, node_link.mac, mtu),
            Interface(pod_link.name, pod_link.mac, mtu, sandbox=request.netns),
        ],
        ips=[IPConfig(a, wiring.GATEWAY, interface=1) for a in addresses],
        routes=routes,
        dns=conf.dns if not conf.dns.is_empty() else ipam_result.dns,
    )
    return merge(prev, ours).to_json(request.cni_version)


def open_pod_netns(path: str) -> Netns:
    try:
        netns = Netns(path)
    except NetnsGone:
        raise CNIError(ERR_INVALID_ENV, f'failed to open netns "{path}": no such file') from None
    except OSError as err:
        raise CNIError(ERR_INVALID_ENV, f'failed to open netns "{path}": {err.strerror}') from None
    try:
        if netns.is_current():
            raise CNIError(
                ERR_INVALID_ENV,
                f'CNI_NETNS "{path}" is the plugin\'s own network '
                "namespace; refusing to configure it",
            )
        with netns.entered():
            pass
    except NotANetns:
        netns.close()
        raise CNIError(ERR_INVALID_ENV, f'CNI_NETNS "{path}" is not a network namespace') from None
    except BaseException:
        netns.close()
        raise
    return netns


def requested_mac(request: Request) -> str | None:
    mac = request.runtime_config("mac") or request.args.get("MAC")
    if mac is None:
        return None
    if not isinstance(mac, str) or not MAC_PATTERN.match(mac):
        raise CNIError(ERR_INVALID_CONFIG, f"invalid MAC address {mac!r} requested")
    return mac.lower()


def pod_addresses(ipam_result: Result) -> list[str]:
    if not ipam_result.ips:
        raise CNIError(ERR_INVALID_CONFIG, "the IPAM plugin returned no address")
    v6 = [ip.address for ip in ipam_result.ips if ip.version != 4]
    if v6:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f"IPAM address {v6[0]}: only IPv4 is supported")
    return [ip.address for ip in ipam_result.ips]


def remove_leftover_veth(node: IPRoute, attachment: wiring.Attachment, bpf_dir: str) -> None:
    """A node-side veth of this very attachment, left by an ADD that was killed."""
    existing = link.get_link(node, attachment.node_veth)
    if existing is None:
        return
    if existing.alias not in (None, attachment.alias):
        raise CNIError(
            ERR_INVALID_ENV,
            f'veth name "{attachment.node_veth}" for container '
            f"{attachment.container_id!r} is taken by {existing.alias!r}",
        )
    log.warning("removing leftover veth %s of %s", existing.name, attachment.alias)
    ips = wiring.unwire(node, attachment, bpf_dir)
    if ips:
        masq.remove(attachment.network, ips)


def rollback(
    node: IPRoute,
    attachment: wiring.Attachment,
    ipam: ipam_client.IPAM,
    allocated: bool,
    bpf_dir: str,
) -> None:
    """Best effort: each undo step runs even if an earlier one fails."""
    try:
        ips = wiring.unwire(node, attachment, bpf_dir)
        if ips:
            masq.remove(attachment.network, ips)
    except Exception as err:
        log.error("rollback of %s: failed to remove the veth: %s", attachment.alias, err)
    if allocated:
        try:
            ipam.delete()
        except Exception as err:
            log.error("rollback of %s: failed to release the address: %s", attachment.alias, err)


def merge(prev: Result | None, ours: Result) -> Result:
    """Chain onto prevResult: keep what earlier plugins reported, append ours."""
    if prev is None:
        return ours
    offset = len(prev.interfaces)
    for ip in ours.ips:
        ip.interface = None if ip.interface is None else ip.interface + offset
    return Result(
        ours.cni_version,
        interfaces=prev.interfaces + ours.interfaces,
        ips=prev.ips + ours.ips,
        routes=prev.routes + ours.routes,
        dns=ours.dns if not ours.dns.is_empty() else prev.dns,
    )


class StopRequest:
    """SIGTERM during ADD: finish the current step, then roll back and fail.

    Raising from the signal handler could interrupt a netlink exchange midway
    and leave the socket unusable for the rollback, so the handler only
    records the request and ADD looks at it between steps.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        signal.signal(signal.SIGTERM, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.signal = signum

    def ignore(self) -> None:
        """From here on, finish regardless (also during interpreter shutdown)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def check(self) -> None:
        if self.signal is not None:
            raise CNIError(ERR_TRY_AGAIN, f"ADD stopped by signal {self.signal}; rolled back")
