"""ADD: allocate the pod's address, wire its veth, masquerade, report the result.

Every step after the IPAM allocation is undone if a later one fails (or the
process is told to stop), so a failed ADD leaves no veth, route, masquerade
entry or address behind.
"""

from __future__ import annotations

# _signal, not signal: the module's enums cost a one-call process more than its use here.
import _signal
import contextlib
import ipaddress
from collections.abc import Callable
from typing import Any

from cni.datapath.maps import Datapath
from cni.net import link, masq, sysctl
from cni.net.netlink import Rtnl, node_socket, pod_socket
from cni.net.netns import open_pod_netns
from cni.net.route import RouteSpec
from cni.plugin import ipam_client, podnet
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import load_conf, refuse_without_agent
from cni.spec.attachment import Attachment
from cni.spec.errors import (
    ERR_INVALID_CONFIG,
    ERR_INVALID_ENV,
    ERR_TRY_AGAIN,
    ERR_UNSUPPORTED_FIELD,
    CNIError,
)
from cni.spec.log import logger
from cni.spec.protocol import Request, prev_result, requested_mac
from cni.spec.result import Interface, IPConfig, Result, Route, chain

log = logger("sluice")

# Runs with the node-side veth's ifindex and the pod's addresses once the datapath
# is attached and before the pair is up (the agent installs the pod's policy there).
BeforeUp = Callable[[int, list[str]], None]


def run(request: Request) -> dict[str, Any]:
    conf = load_conf(request)
    refuse_without_agent(conf)
    stop = StopRequest()
    with Datapath(conf.bpf_dir) as datapath:
        result = add(
            conf,
            request.attachment,
            prev_result(request),
            requested_mac(request),
            datapath=datapath,
            stop=stop.check,
        )
    stop.ignore()  # the pod is wired: finish and report it
    return result.to_json(request.cni_version)


def add(
    conf: NetConf,
    attachment: Attachment,
    prev: Result | None = None,
    mac: str | None = None,
    *,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
    stop: Callable[[], None] = lambda: None,
    before_up: BeforeUp | None = None,
) -> Result:
    """Wire the attachment and return its result chained onto ``prev``.

    ``datapath``: the process's handle on the network's datapath; ``allocators``:
    the IPAM allocators a long-lived caller keeps open. ``stop`` is called between
    steps and may raise to abort (everything done so far is undone).
    """
    with (
        open_pod_netns(attachment.netns) as netns,
        node_socket() as node,
        pod_socket(netns) as pod,
        ipam_client.client(conf.ipam, conf.cni_version, allocators) as ipam,
    ):
        if link.get_link(pod, attachment.ifname) is not None:
            raise CNIError(
                ERR_INVALID_ENV,
                f'interface "{attachment.ifname}" already exists in netns "{attachment.netns}"',
            )
        remove_leftover_veth(node, conf, attachment, datapath)
        mtu = conf.mtu or (
            (link.default_route_mtu(node) or podnet.DEFAULT_MTU) - conf.encapsulation_overhead
        )
        ensure_datapath(conf, datapath)
        stop()
        pair = podnet.VethPair(attachment.node_veth, attachment.alias, attachment.ifname)
        allocated = False
        addresses: list[str] = []
        attaching: podnet.Attaching | None = None
        try:
            # The pair first, so that its programs attach (the kernel's grace periods)
            # while the address is allocated and the policy installed; it stays down
            # until all of that is done.
            node_index, attaching = podnet.create_pair(
                node, pod, netns.fd, pair, mtu, mac, datapath, conf.datapath.attach == "tcx"
            )
            ipam_result, allocated = ipam.add(attachment)
            stop()
            addresses = pod_addresses(ipam_result)
            ips = [a.split("/")[0] for a in addresses]
            cluster = conf.cluster_cidr or ipaddress.IPv4Interface(addresses[0]).network
            routes = podnet.pod_routes([route_spec(r) for r in ipam_result.routes])
            sysctl.ensure("net.ipv4.ip_forward", "1")
            if conf.ip_masq:
                masq.add(conf.network, cluster, ips)
            hook = None
            if before_up is not None:
                hook = lambda ifindex: before_up(ifindex, ips)  # noqa: E731
            node_link, pod_link = podnet.connect(
                node, pod, node_index, pair, addresses, routes, datapath, attaching, hook
            )
            stop()
        except BaseException:
            if attaching is not None:
                with contextlib.suppress(BaseException):
                    attaching.wait()  # never remove a veth the thread still works on
            rollback(node, conf, attachment, datapath, ipam, allocated, addresses)
            raise

    ours = Result(
        conf.cni_version,
        interfaces=[
            Interface(node_link.name, node_link.mac, mtu),
            Interface(pod_link.name, pod_link.mac, mtu, sandbox=attachment.netns),
        ],
        ips=[IPConfig(a, podnet.GATEWAY, interface=1) for a in addresses],
        routes=[result_route(r) for r in routes],
        dns=conf.dns if not conf.dns.is_empty() else ipam_result.dns,
    )
    return chain(prev, ours)


def ensure_datapath(conf: NetConf, datapath: Datapath) -> None:
    """Compile and pin the datapath only if nothing is pinned yet ("policy": "off"
    without an agent); the compiler is not even imported otherwise."""
    if datapath.is_loaded():
        return
    from cni.datapath import loader

    loader.ensure_loaded(conf.bpf_dir, conf.datapath)


def route_spec(route: Route) -> RouteSpec:
    return RouteSpec(
        route.dst, route.gw, route.mtu, route.advmss, route.priority, route.table, route.scope
    )


def result_route(spec: RouteSpec) -> Route:
    return Route(spec.dst, spec.gw, spec.mtu, spec.advmss, spec.priority, spec.table, spec.scope)


def pod_addresses(ipam_result: Result) -> list[str]:
    if not ipam_result.ips:
        raise CNIError(ERR_INVALID_CONFIG, "the IPAM plugin returned no address")
    v6 = [ip.address for ip in ipam_result.ips if ip.version != 4]
    if v6:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f"IPAM address {v6[0]}: only IPv4 is supported")
    return [ip.address for ip in ipam_result.ips]


def remove_leftover_veth(
    node: Rtnl, conf: NetConf, attachment: Attachment, datapath: Datapath
) -> None:
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
    ips = podnet.node_routed_ips(node, existing)
    podnet.disconnect(node, existing, datapath, ips)
    masq.remove(conf.network, ips)


def rollback(
    node: Rtnl,
    conf: NetConf,
    attachment: Attachment,
    datapath: Datapath,
    ipam: ipam_client.IPAM,
    allocated: bool,
    addresses: list[str],
) -> None:
    """Best effort: each undo step runs even if an earlier one fails."""
    ips = {a.split("/")[0] for a in addresses}
    try:
        veth = link.get_link(node, attachment.node_veth)
        if veth is not None:
            ips.update(podnet.node_routed_ips(node, veth))
            podnet.disconnect(node, veth, datapath, sorted(ips))
    except Exception as err:
        log.error("rollback of %s: failed to remove the veth: %s", attachment.alias, err)
    try:
        masq.remove(conf.network, sorted(ips))
    except Exception as err:
        log.error("rollback of %s: failed to stop masquerading: %s", attachment.alias, err)
    if allocated:
        try:
            ipam.delete(attachment)
        except Exception as err:
            log.error("rollback of %s: failed to release the address: %s", attachment.alias, err)


class StopRequest:
    """SIGTERM during ADD: finish the current step, then roll back and fail.

    Raising from the signal handler could interrupt a netlink exchange midway
    and leave the socket unusable for the rollback, so the handler only
    records the request and ADD looks at it between steps.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        _signal.signal(_signal.SIGTERM, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.signal = signum

    def ignore(self) -> None:
        """From here on, finish regardless (also during interpreter shutdown)."""
        _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)

    def check(self) -> None:
        if self.signal is not None:
            self.ignore()
            raise CNIError(ERR_TRY_AGAIN, f"ADD stopped by signal {self.signal}; rolled back")
