"""ADD: the pod's veth pair, its address, masquerading and its policy, then up.

``add`` reads top to bottom as the steps it takes. Each step registers how to
undo it as it is taken (``Undo``); a failure, or a SIGTERM noticed between
steps, runs those undos backwards, so a failed ADD leaves no veth, route,
endpoint, policy, masquerade entry or address behind.
"""

from __future__ import annotations

# _signal, not signal: the module's enums cost a one-call process more than its use here.
import _signal
import contextlib
import ipaddress
from collections.abc import Callable
from typing import Any, Protocol

from cni.datapath.endpoint import DatapathEndpoints
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
from cni.spec.result import DNS, Interface, IPConfig, Result, Route, chain

log = logger("sluice")


class PolicyStep(Protocol):
    """The pod's policy, installed while its veth is still down (the agent's enforcer).
    ``remove`` undoes ``install``, one that failed halfway too."""

    def install(self, ifindex: int, ips: list[str]) -> None: ...
    def remove(self) -> None: ...


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
    policy: PolicyStep | None = None,
) -> Result:
    """Wire the attachment and return its result chained onto ``prev``.

    ``datapath``: the process's handle on the network's datapath; ``allocators``:
    the IPAM allocators a long-lived caller keeps open; ``policy``: the pod's
    policy (the agent's; none without one). ``stop`` is called between steps and
    may raise to abort (everything done so far is undone).
    """
    with contextlib.ExitStack() as opened:
        netns = opened.enter_context(open_pod_netns(attachment.netns))
        node = opened.enter_context(node_socket())
        pod = opened.enter_context(pod_socket(netns))
        ipam = opened.enter_context(ipam_client.client(conf.ipam, conf.cni_version, allocators))
        refuse_existing_interface(pod, attachment)
        remove_leftover_veth(node, conf, attachment, datapath)
        veth = podnet.VethPlan(
            podnet.VethPair(attachment.node_veth, attachment.alias, attachment.ifname),
            pod_mtu(conf, node),
            mac,
            tcx=conf.datapath.attach == "tcx",
        )
        ensure_datapath(conf, datapath)
        endpoints = DatapathEndpoints(datapath)
        stop()

        with Undo(attachment.alias) as undo:
            lease = Lease(ipam, attachment)
            # Registered first, so undone last: the address is free again only once
            # no veth routes it.
            undo.push("release the address", lease.release)
            # The pair before the address, so that its programs attach (the kernel's
            # grace periods) while the address is allocated and the policy installed.
            made = podnet.create_pair(node, pod, netns.fd, veth, endpoints)
            undo.push(
                "remove the veth", lambda: podnet.remove_pair(node, made, endpoints, lease.ips)
            )
            addressing = lease.take()
            stop()
            sysctl.ensure("net.ipv4.ip_forward", "1")
            if conf.ip_masq:
                undo.push("stop masquerading", lambda: masq.remove(conf.network, addressing.ips))
                masq.add(conf.network, cluster_range(conf, addressing), addressing.ips)
            podnet.register(endpoints, made, addressing)  # removed with the pair
            if policy is not None:
                undo.push("forget the pod's policy", policy.remove)
                policy.install(made.ifindex, addressing.ips)
            node_link, pod_link = podnet.bring_up(node, pod, made, addressing)
            stop()
            undo.commit()

    ours = Result(
        conf.cni_version,
        interfaces=[
            Interface(node_link.name, node_link.mac, veth.mtu),
            Interface(pod_link.name, pod_link.mac, veth.mtu, sandbox=attachment.netns),
        ],
        ips=[IPConfig(a, podnet.GATEWAY, interface=1) for a in addressing.addresses],
        routes=[result_route(r) for r in addressing.routes],
        dns=conf.dns if not conf.dns.is_empty() else lease.dns(),
    )
    return chain(prev, ours)


class Undo:
    """The undo of each step taken, run backwards when the block fails; each runs even
    if an earlier one fails (logged), and the block's own error is what propagates."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self._steps = contextlib.ExitStack()

    def __enter__(self) -> Undo:
        return self

    def __exit__(self, *exc: object) -> None:
        self._steps.close()  # after commit(): empty

    def push(self, what: str, undo: Callable[[], object]) -> None:
        def best_effort() -> None:
            try:
                undo()
            except Exception as err:
                log.error("rollback of %s: failed to %s: %s", self.subject, what, err)

        self._steps.callback(best_effort)

    def commit(self) -> None:
        """Every step done: nothing is undone."""
        self._steps.pop_all()


class Lease:
    """The attachment's addresses from its IPAM. ``release`` gives them back only if
    this ADD allocated them: a repeated ADD finds them allocated and keeps them."""

    def __init__(self, ipam: ipam_client.IPAM, attachment: Attachment) -> None:
        self.ipam = ipam
        self.attachment = attachment
        self.result: Result | None = None
        self.allocated = False

    def take(self) -> podnet.Addressing:
        self.result, self.allocated = self.ipam.add(self.attachment)
        return podnet.Addressing(
            pod_addresses(self.result),
            podnet.pod_routes([route_spec(r) for r in self.result.routes]),
        )

    @property
    def ips(self) -> list[str]:
        """The IPv4 addresses allocated so far (an undo reads them: never raises)."""
        if self.result is None:
            return []
        return [ip.address.split("/")[0] for ip in self.result.ips if ip.version == 4]

    def dns(self) -> DNS:
        assert self.result is not None
        return self.result.dns

    def release(self) -> None:
        if self.allocated:
            self.ipam.delete(self.attachment)


def refuse_existing_interface(pod: Rtnl, attachment: Attachment) -> None:
    if link.get_link(pod, attachment.ifname) is not None:
        raise CNIError(
            ERR_INVALID_ENV,
            f'interface "{attachment.ifname}" already exists in netns "{attachment.netns}"',
        )


def pod_mtu(conf: NetConf, node: Rtnl) -> int:
    """The configured MTU, else the default route's less what the tunnel adds."""
    if conf.mtu:
        return conf.mtu
    return (link.default_route_mtu(node) or podnet.DEFAULT_MTU) - conf.encapsulation_overhead


def cluster_range(conf: NetConf, addressing: podnet.Addressing) -> ipaddress.IPv4Network:
    """What is not masqueraded: the cluster's pod range, else the pod's subnet."""
    return conf.cluster_cidr or ipaddress.IPv4Interface(addressing.addresses[0]).network


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
    podnet.disconnect(node, existing, DatapathEndpoints(datapath), ips)
    masq.remove(conf.network, ips)


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
