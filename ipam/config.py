"""IPAM configuration (the ``ipam`` object of a network) and its validation.

Two modes:

- ``node-cidr`` (default): addresses from one subnet, the node's podCIDR;
- ``prefix``: the node claims aligned blocks (``prefixLength``, /28 by
  default) from a ``pool`` shared by many nodes, only as it needs them. The
  claims live in a local store (``claimStore: "local"``, one host) or in the
  Kubernetes API (``claimStore: "kubernetes"``, a cluster; see
  ``ipam.claim_stores``).
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost a one-call process
import ipaddress
import re
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ipam.errors import InvalidConfig, Unsupported

DEFAULT_STATE_DIR = "/var/lib/sluice"
DEFAULT_COOLDOWN_SECONDS = 120.0  # longer than conntrack's SYN_SENT timeout
DEFAULT_PREFIX_LENGTH = 28
DEFAULT_WARM_PREFIXES = 1
NODE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
CLAIM_STORES = ("local", "kubernetes")
# A Kubernetes node name that also fits a label value (the claims carry it in one).
KUBERNETES_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


class IPAMRoute(NamedTuple):
    dst: ipaddress.IPv4Network
    gw: ipaddress.IPv4Address | None = None

    def to_json(self) -> dict[str, str]:
        return {"dst": str(self.dst), **({"gw": str(self.gw)} if self.gw else {})}


@runtime_checkable
class IPAMConfig(Protocol):
    """What the configurations of both modes have (each mode's is a NamedTuple, whose
    fields are read-only)."""

    @property
    def network(self) -> str: ...
    @property
    def routes(self) -> tuple[IPAMRoute, ...]: ...
    @property
    def cooldown_seconds(self) -> float: ...
    @property
    def state_dir(self) -> str: ...

    def to_json(self) -> dict[str, Any]:
        """The configuration as the ``ipam`` object would state it, defaults filled in."""
        ...


class NodeCIDRConfig(NamedTuple):
    network: str
    routes: tuple[IPAMRoute, ...]
    cooldown_seconds: float
    state_dir: str
    subnet: ipaddress.IPv4Network
    range_start: ipaddress.IPv4Address
    range_end: ipaddress.IPv4Address
    gateway: ipaddress.IPv4Address | None

    @property
    def mode(self) -> str:
        return "node-cidr"

    @property
    def address_range(self) -> ipaddress.IPv4Network:
        return self.subnet

    @property
    def size(self) -> int:
        """Addresses the range can hand out (gateway excluded)."""
        count = int(self.range_end) - int(self.range_start) + 1
        if self.gateway is not None and self.range_start <= self.gateway <= self.range_end:
            count -= 1
        return count

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "sluice-ipam",
            "mode": self.mode,
            "subnet": str(self.subnet),
            "rangeStart": str(self.range_start),
            "rangeEnd": str(self.range_end),
            "gateway": str(self.gateway) if self.gateway else None,
            "routes": [r.to_json() for r in self.routes],
            "cooldownSeconds": self.cooldown_seconds,
        }


class PrefixConfig(NamedTuple):
    network: str
    routes: tuple[IPAMRoute, ...]
    cooldown_seconds: float
    state_dir: str
    pool: ipaddress.IPv4Network
    prefix_length: int
    warm_prefixes: int
    claims_dir: str
    node_name: str
    claim_store: str = "local"  # one of CLAIM_STORES

    @property
    def mode(self) -> str:
        return "prefix"

    @property
    def address_range(self) -> ipaddress.IPv4Network:
        return self.pool

    @property
    def block_size(self) -> int:
        return 1 << (32 - self.prefix_length)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "sluice-ipam",
            "mode": self.mode,
            "pool": str(self.pool),
            "prefixLength": self.prefix_length,
            "warmPrefixes": self.warm_prefixes,
            "claimStore": self.claim_store,
            **({"claimsDir": self.claims_dir} if self.claim_store == "local" else {}),
            "nodeName": self.node_name,
            "routes": [r.to_json() for r in self.routes],
            "cooldownSeconds": self.cooldown_seconds,
        }


def parse(
    network: str, ipam: Any, plugin_state_dir: str | None = None
) -> NodeCIDRConfig | PrefixConfig:
    """Read a network's ``ipam`` object.

    ``stateDir`` is taken from the ipam object, else from the plugin object
    (``plugin_state_dir``), so that the same store serves sluice and any other
    plugin delegating to sluice-ipam.
    """
    if not isinstance(ipam, dict):
        raise InvalidConfig(f'the "ipam" object is required, got {ipam!r}')
    state_dir = ipam.get("stateDir") or plugin_state_dir or DEFAULT_STATE_DIR
    common = {
        "network": network,
        "routes": _routes(ipam.get("routes")),
        "cooldown_seconds": _cooldown(ipam.get("cooldownSeconds", DEFAULT_COOLDOWN_SECONDS)),
        "state_dir": _absolute(state_dir, "stateDir"),
    }
    mode = ipam.get("mode", "node-cidr")
    if mode == "node-cidr":
        return _node_cidr(ipam, common)
    if mode == "prefix":
        return _prefix(ipam, common)
    raise Unsupported(
        f'"ipam.mode": {mode!r} is not supported (supported: "node-cidr", "prefix")',
    )


def _node_cidr(ipam: dict[str, Any], common: dict[str, Any]) -> NodeCIDRConfig:
    subnet = _network(ipam.get("subnet"), "subnet")
    if subnet.prefixlen > 30:
        raise InvalidConfig(
            f'"ipam.subnet" {str(subnet)!r} is too small to allocate from (at most /30)',
        )
    first, last = subnet[1], subnet[-2]  # network and broadcast are never handed out
    range_start = _address(ipam, "rangeStart", subnet, default=first)
    range_end = _address(ipam, "rangeEnd", subnet, default=last)
    if range_start > range_end:
        raise InvalidConfig(
            f'"ipam.rangeStart" {range_start} is after "ipam.rangeEnd" {range_end}',
        )
    if "gateway" in ipam and ipam["gateway"] is None:
        gateway = None
    else:
        gateway = _address(ipam, "gateway", subnet, default=first)
    parsed = NodeCIDRConfig(
        **common, subnet=subnet, range_start=range_start, range_end=range_end, gateway=gateway
    )
    if parsed.size < 1:
        raise InvalidConfig(
            f"range {range_start}-{range_end} of {subnet} leaves no address to hand out",
        )
    return parsed


def _prefix(ipam: dict[str, Any], common: dict[str, Any]) -> PrefixConfig:
    pool = _network(ipam.get("pool"), "pool")
    length = ipam.get("prefixLength", DEFAULT_PREFIX_LENGTH)
    if not _is_int(length) or not pool.prefixlen <= length <= 32:
        raise InvalidConfig(
            f'invalid "ipam.prefixLength" {length!r}: must be between the pool\'s '
            f"/{pool.prefixlen} and 32",
        )
    warm = ipam.get("warmPrefixes", DEFAULT_WARM_PREFIXES)
    if not _is_int(warm) or warm < 0:
        raise InvalidConfig(f'invalid "ipam.warmPrefixes" {warm!r}: must be 0 or more')
    claim_store = ipam.get("claimStore", "local")
    if claim_store not in CLAIM_STORES:
        raise InvalidConfig(
            f'invalid "ipam.claimStore" {claim_store!r}: expected one of {list(CLAIM_STORES)}'
        )
    if claim_store == "kubernetes" and ipam.get("claimsDir"):
        raise InvalidConfig(
            '"ipam.claimsDir" names a local claim store; with "ipam.claimStore": '
            '"kubernetes" the claims live in the API (remove one of them)'
        )
    claims_dir = ipam.get("claimsDir") or f"{common['state_dir']}/claims"
    node = ipam.get("nodeName") or _socket.gethostname()
    if not isinstance(node, str) or not NODE_NAME.match(node):
        raise InvalidConfig(f'invalid "ipam.nodeName" {node!r}')
    if claim_store == "kubernetes" and not KUBERNETES_NODE_NAME.match(node):
        raise InvalidConfig(
            f'invalid "ipam.nodeName" {node!r} for "ipam.claimStore": "kubernetes": a '
            "Kubernetes node name of at most 63 lowercase letters, digits, '-' and '.' "
            "(the claims carry it in a label)"
        )
    return PrefixConfig(
        **common,
        pool=pool,
        prefix_length=length,
        warm_prefixes=warm,
        claims_dir=_absolute(claims_dir, "ipam.claimsDir"),
        node_name=node,
        claim_store=claim_store,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _absolute(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidConfig(f'invalid "{key}" {value!r}: must be an absolute path')
    return value


def _cooldown(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidConfig(
            f'invalid "ipam.cooldownSeconds" {value!r}: must be a number of seconds, 0 or more',
        )
    return float(value)


def _network(value: Any, key: str) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise InvalidConfig(f'"ipam.{key}" is required, got {value!r}')
    try:
        network = ipaddress.ip_network(value)
    except ValueError as err:
        raise InvalidConfig(f'invalid "ipam.{key}" {value!r}: {err}') from None
    if not isinstance(network, ipaddress.IPv4Network):
        raise Unsupported(f'"ipam.{key}": {value!r}: only IPv4 is supported')
    return network


def _address(
    ipam: dict[str, Any],
    key: str,
    subnet: ipaddress.IPv4Network,
    default: ipaddress.IPv4Address,
) -> ipaddress.IPv4Address:
    value = ipam.get(key)
    if value is None:
        return default
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise InvalidConfig(f'invalid "ipam.{key}" {value!r}: not an IPv4 address') from None
    if address not in subnet or address in (subnet.network_address, subnet.broadcast_address):
        raise InvalidConfig(f'"ipam.{key}" {value} is not a usable address of {subnet}')
    return address


def _routes(value: Any) -> tuple[IPAMRoute, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidConfig(f'"ipam.routes" must be a list, got {value!r}')
    routes = []
    for i, raw in enumerate(value):
        where = f"ipam.routes[{i}]"
        if not isinstance(raw, dict):
            raise InvalidConfig(f'"{where}" must be an object, got {raw!r}')
        try:
            dst = ipaddress.ip_network(raw.get("dst", ""))
            gw = ipaddress.ip_address(raw["gw"]) if raw.get("gw") else None
        except (TypeError, ValueError) as err:
            raise InvalidConfig(f'invalid "{where}" {raw!r}: {err}') from None
        if not isinstance(dst, ipaddress.IPv4Network) or not isinstance(
            gw, ipaddress.IPv4Address | None
        ):
            raise Unsupported(f'"{where}": {raw!r}: only IPv4 is supported')
        routes.append(IPAMRoute(dst, gw))
    return tuple(routes)


def from_plugin(network: str, plugin: dict[str, Any]) -> NodeCIDRConfig | PrefixConfig:
    """The IPAM configuration of a plugin object (its ``ipam`` and ``stateDir``)."""
    return parse(network, plugin.get("ipam"), plugin.get("stateDir"))
