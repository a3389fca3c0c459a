"""The ``sluice`` plugin's network configuration: defaults and validation.

Every invalid value is reported with its key and value (code 7), and a value
sluice understands but does not support yet with code 2.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from cni.errors import ERR_INVALID_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError
from cni.protocol import Request
from cni.result import DNS

DEFAULT_STATE_DIR = "/var/lib/sluice"
DEFAULT_BPF_DIR = "/sys/fs/bpf/sluice"
DEFAULT_AGENT_SOCKET = "/run/sluice/agent.sock"
POLICY_MODES = ("enforce", "off")
BUILTIN_IPAM = "sluice-ipam"


@dataclass(frozen=True)
class NetConf:
    network: str
    mtu: int | None  # None: the MTU of the node's default-route interface
    ip_masq: bool
    cluster_cidr: ipaddress.IPv4Network | None
    policy: str
    state_dir: str
    bpf_dir: str
    agent_socket: str
    ipam: dict[str, Any]
    dns: DNS
    log_file: str | None

    @property
    def ipam_type(self) -> str:
        return str(self.ipam["type"])

    @property
    def builtin_ipam(self) -> bool:
        return self.ipam_type == BUILTIN_IPAM


def load(request: Request) -> NetConf:
    return parse(request.config)


def parse(config: dict[str, Any]) -> NetConf:
    ipam = config.get("ipam")
    if not isinstance(ipam, dict) or not ipam.get("type"):
        raise CNIError(
            ERR_INVALID_CONFIG, f'the "ipam" object with a "type" is required, got {ipam!r}'
        )
    if not isinstance(ipam["type"], str) or "/" in ipam["type"] or "\\" in ipam["type"]:
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "ipam.type" {ipam["type"]!r}')

    policy = config.get("policy", "enforce")
    if policy not in POLICY_MODES:
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "policy" {policy!r}: expected one of {list(POLICY_MODES)}'
        )

    cluster = config.get("clusterCIDR")
    cluster_cidr = _ipv4_network(cluster, "clusterCIDR") if cluster else _ipam_cidr(ipam)

    return NetConf(
        network=config["name"],
        mtu=_mtu(config.get("mtu")),
        ip_masq=_bool(config.get("ipMasq", True), "ipMasq"),
        cluster_cidr=cluster_cidr,
        policy=policy,
        state_dir=_path(config.get("stateDir", DEFAULT_STATE_DIR), "stateDir"),
        bpf_dir=_path(config.get("bpfDir", DEFAULT_BPF_DIR), "bpfDir"),
        agent_socket=_path(config.get("agentSocket", DEFAULT_AGENT_SOCKET), "agentSocket"),
        ipam=ipam,
        dns=DNS.from_json(config.get("dns"), "config"),
        log_file=_path(config["logFile"], "logFile") if config.get("logFile") else None,
    )


def _ipam_cidr(ipam: dict[str, Any]) -> ipaddress.IPv4Network | None:
    """The range the IPAM hands out from, the default cluster range for ipMasq."""
    candidate = ipam.get("subnet") or ipam.get("pool")
    ranges = ipam.get("ranges")
    if not candidate and isinstance(ranges, list) and ranges and isinstance(ranges[0], list):
        first = ranges[0][0] if ranges[0] else None
        candidate = first.get("subnet") if isinstance(first, dict) else None
    if not candidate:
        return None
    key = "ipam.subnet" if ipam.get("subnet") else "ipam.pool"
    return _ipv4_network(candidate, key)


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
