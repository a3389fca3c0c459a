"""The ``sluice`` plugin's network configuration: defaults and validation.

Every invalid value is reported with its key and value (code 7), and a value
sluice understands but does not support yet with code 2.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, NamedTuple

from cni.datapath import settings as datapath_settings
from cni.datapath.settings import DatapathSettings
from cni.spec.errors import ERR_INVALID_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError, from_ipam
from cni.spec.protocol import Request
from cni.spec.result import DNS
from ipam import config as ipam_config
from ipam.errors import IPAMError

DEFAULT_STATE_DIR = "/var/lib/sluice"
DEFAULT_BPF_DIR = "/sys/fs/bpf/sluice"
DEFAULT_AGENT_SOCKET = "/run/sluice/agent.sock"
POLICY_MODES = ("enforce", "off")
# How pods reach the pods of other nodes (cni/agent/routes.py): "native", one route per
# remote node's pod range via its InternalIP; "vxlan", the same ranges through a tunnel,
# for node networks that drop packets whose source is not a node. Geneve is refused:
# it adds nothing sluice needs (no options are carried) and some kernels lack it.
ROUTING_MODES = ("native", "vxlan")
TUNNEL_MODES = ("geneve",)
# What a VXLAN packet adds around the pod's: outer IPv4 20, UDP 8, VXLAN 8, inner
# Ethernet 14 (RFC 7348).
VXLAN_OVERHEAD = 50
# The tunnel's UDP port (IANA's VXLAN port) and VXLAN network identifier; every node of a
# network must have the same. Pods cannot send UDP to the port at all in vxlan mode.
DEFAULT_TUNNEL_PORT = 4789
DEFAULT_TUNNEL_VNI = 7346
BUILTIN_IPAM = "sluice-ipam"


class DelegatedIPAM(NamedTuple):
    """An IPAM plugin other than sluice-ipam, run through CNI_PATH with the
    runtime's own environment and stdin (as the spec requires)."""

    plugin_type: str
    stdin: bytes
    cni_path: tuple[str, ...] = ()
    env: Mapping[str, str] = {}  # never changed, like the tuple holding it

    def __repr__(self) -> str:
        # The runtime's stdin and environment stay out of logs and error messages.
        return f"DelegatedIPAM(plugin_type={self.plugin_type!r}, cni_path={self.cni_path!r})"


IPAMConf = ipam_config.NodeCIDRConfig | ipam_config.PrefixConfig | DelegatedIPAM


class NetConf(NamedTuple):
    network: str
    cni_version: str
    mtu: int | None  # None: the MTU of the node's default-route interface
    ip_masq: bool
    # The cluster's pod range for ipMasq. None with a delegated IPAM and no
    # "clusterCIDR": the network of the first address the delegate hands out.
    cluster_cidr: ipaddress.IPv4Network | None
    policy: str
    state_dir: str
    bpf_dir: str
    agent_socket: str
    ipam: IPAMConf
    dns: DNS
    log_file: str | None
    datapath: DatapathSettings = DatapathSettings()
    # Interfaces towards other nodes, where the agent judges service flows to remote
    # backends (None: the interface of the node's default route).
    uplinks: tuple[str, ...] | None = None
    routing: str = "native"
    tunnel_port: int = DEFAULT_TUNNEL_PORT
    tunnel_vni: int = DEFAULT_TUNNEL_VNI

    @property
    def encapsulation_overhead(self) -> int:
        """Bytes the routing mode adds to every packet to another node (the pod MTU
        leaves room for them when "mtu" is not given)."""
        return VXLAN_OVERHEAD if self.routing == "vxlan" else 0

    @property
    def ipam_type(self) -> str:
        return self.ipam.plugin_type if isinstance(self.ipam, DelegatedIPAM) else BUILTIN_IPAM


def parse(
    config: dict[str, Any],
    *,
    stdin: bytes = b"",
    cni_path: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> NetConf:
    """The plugin configuration as sluice uses it. ``stdin``, ``cni_path`` and
    ``env`` are what a delegated IPAM plugin is run with."""
    ipam = config.get("ipam")
    if not isinstance(ipam, dict) or not ipam.get("type"):
        raise CNIError(
            ERR_INVALID_CONFIG, f'the "ipam" object with a "type" is required, got {ipam!r}'
        )
    ipam_type = ipam["type"]
    if not isinstance(ipam_type, str) or "/" in ipam_type or "\\" in ipam_type:
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "ipam.type" {ipam_type!r}')

    policy = config.get("policy", "enforce")
    if policy not in POLICY_MODES:
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "policy" {policy!r}: expected one of {list(POLICY_MODES)}'
        )
    state_dir = _path(config.get("stateDir", DEFAULT_STATE_DIR), "stateDir")
    parsed_ipam: IPAMConf
    if ipam_type == BUILTIN_IPAM:
        try:
            parsed_ipam = ipam_config.parse(config["name"], ipam, state_dir)
        except IPAMError as err:
            raise from_ipam(err) from None
    else:
        parsed_ipam = DelegatedIPAM(ipam_type, stdin, cni_path, dict(env or {}))

    cluster = config.get("clusterCIDR")
    cluster_cidr = _ipv4_network(cluster, "clusterCIDR") if cluster else None
    if cluster_cidr is None and not isinstance(parsed_ipam, DelegatedIPAM):
        cluster_cidr = parsed_ipam.address_range

    return NetConf(
        network=config["name"],
        cni_version=str(config.get("cniVersion") or "0.1.0"),
        mtu=_mtu(config.get("mtu")),
        ip_masq=_bool(config.get("ipMasq", True), "ipMasq"),
        cluster_cidr=cluster_cidr,
        policy=policy,
        state_dir=state_dir,
        bpf_dir=_path(config.get("bpfDir", DEFAULT_BPF_DIR), "bpfDir"),
        agent_socket=_path(config.get("agentSocket", DEFAULT_AGENT_SOCKET), "agentSocket"),
        ipam=parsed_ipam,
        dns=DNS.from_json(config.get("dns"), "config"),
        log_file=_path(config["logFile"], "logFile") if config.get("logFile") else None,
        datapath=_datapath(config.get("datapath")),
        uplinks=_uplinks(config.get("uplinks")),
        routing=_routing(config.get("routing", "native")),
        tunnel_port=_integer(config.get("tunnelPort", DEFAULT_TUNNEL_PORT), "tunnelPort", 1, 65535),
        tunnel_vni=_integer(config.get("tunnelVNI", DEFAULT_TUNNEL_VNI), "tunnelVNI", 1, 0xFFFFFF),
    )


def _integer(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "{key}" {value!r}: an integer from {low} to {high}'
        )
    return value


def _routing(value: Any) -> str:
    if value in TUNNEL_MODES:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f'"routing": {value!r} is not supported: use "vxlan"')
    if value not in ROUTING_MODES:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f'invalid "routing" {value!r}: expected one of {list(ROUTING_MODES)}',
        )
    return str(value)


def _datapath(value: Any) -> DatapathSettings:
    try:
        return datapath_settings.parse(value)
    except ValueError as err:
        raise CNIError(ERR_INVALID_CONFIG, str(err)) from None


def _uplinks(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, str) and 0 < len(v) <= 15 and "/" not in v for v in value
    ):
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "uplinks" {value!r}: must be a list of interface names'
        )
    return tuple(value)


def _ipv4_network(value: Any, key: str) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "{key}" {value!r}: not a CIDR') from None
    if network.version != 4:
        raise CNIError(ERR_UNSUPPORTED_FIELD, f'"{key}": {value!r}: only IPv4 is supported')
    return network


def _mtu(value: Any) -> int | None:
    if value is None or value == 0:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 68 <= value <= 65535:
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "mtu" {value!r}: must be 68 to 65535')
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "{key}" {value!r}: must be true or false')
    return value


def _path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "{key}" {value!r}: must be an absolute path')
    return value


def from_request(request: Request) -> NetConf:
    return parse(
        request.config, stdin=request.raw_config, cni_path=request.plugin_path, env=request.env
    )
