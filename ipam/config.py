"""IPAM configuration (the ``ipam`` object of a network) and its validation."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from cni.errors import ERR_INVALID_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError

DEFAULT_STATE_DIR = "/var/lib/sluice"
DEFAULT_COOLDOWN_SECONDS = 120.0  # longer than conntrack's SYN_SENT timeout


@dataclass(frozen=True)
class IPAMRoute:
    dst: ipaddress.IPv4Network
    gw: ipaddress.IPv4Address | None = None


@dataclass(frozen=True)
class NodeCIDRConfig:
    network: str
    subnet: ipaddress.IPv4Network
    range_start: ipaddress.IPv4Address
    range_end: ipaddress.IPv4Address
    gateway: ipaddress.IPv4Address | None
    routes: tuple[IPAMRoute, ...]
    cooldown_seconds: float
    state_dir: str

    @property
    def size(self) -> int:
        """Addresses the range can hand out (gateway excluded)."""
        count = int(self.range_end) - int(self.range_start) + 1
        if self.gateway is not None and self.range_start <= self.gateway <= self.range_end:
            count -= 1
        return count


def parse(network: str, config: dict[str, Any]) -> NodeCIDRConfig:
    """Read the ``ipam`` object of ``config`` (a plugin configuration).

    ``stateDir`` is taken from the ipam object, else from the plugin object, so
    that the same store serves sluice and any other plugin delegating to
    sluice-ipam.
    """
    ipam = config.get("ipam")
    if not isinstance(ipam, dict):
        raise CNIError(ERR_INVALID_CONFIG, f'the "ipam" object is required, got {ipam!r}')
    mode = ipam.get("mode", "node-cidr")
    if mode != "node-cidr":
        raise CNIError(
            ERR_UNSUPPORTED_FIELD,
            f'"ipam.mode": {mode!r} is not supported (supported: "node-cidr")',
        )

    subnet = _subnet(ipam.get("subnet"))
    first, last = subnet[1], subnet[-2]  # network and broadcast are never handed out
    range_start = _address(ipam, "rangeStart", subnet, default=first)
    range_end = _address(ipam, "rangeEnd", subnet, default=last)
    if range_start > range_end:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f'"ipam.rangeStart" {range_start} is after "ipam.rangeEnd" {range_end}',
        )
    if "gateway" in ipam and ipam["gateway"] is None:
        gateway = None
    else:
        gateway = _address(ipam, "gateway", subnet, default=first)

    state_dir = ipam.get("stateDir") or config.get("stateDir") or DEFAULT_STATE_DIR
    if not isinstance(state_dir, str) or not state_dir.startswith("/"):
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "stateDir" {state_dir!r}: must be an absolute path'
        )

    cooldown = ipam.get("cooldownSeconds", DEFAULT_COOLDOWN_SECONDS)
    if isinstance(cooldown, bool) or not isinstance(cooldown, int | float) or cooldown < 0:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f'invalid "ipam.cooldownSeconds" {cooldown!r}: must be a number of seconds, 0 or more',
        )

    parsed = NodeCIDRConfig(
        network=network,
        subnet=subnet,
        range_start=range_start,
        range_end=range_end,
        gateway=gateway,
        routes=_routes(ipam.get("routes")),
        cooldown_seconds=float(cooldown),
        state_dir=state_dir,
    )
    if parsed.size < 1:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f"range {range_start}-{range_end} of {subnet} leaves no address to hand out",
        )
    return parsed


def _subnet(value: Any) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise CNIError(ERR_INVALID_CONFIG, f'"ipam.subnet" is required, got {value!r}')
    try:
        subnet = ipaddress.ip_network(value)
    except ValueError as err:
        raise CNIError(ERR_INVALID_CONFIG, f'invalid "ipam.subnet" {value!r}: {err}') from None
    if not isinstance(subnet, ipaddress.IPv4Network):
        raise CNIError(ERR_UNSUPPORTED_FIELD, f'"ipam.subnet": {value!r}: only IPv4 is supported')
    if subnet.prefixlen > 30:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f'"ipam.subnet" {value!r} is too small to allocate from (at most /30)',
        )
    return subnet


def _address(
    ipam: dict[str, Any], key: str, subnet: ipaddress.IPv4Network, default: ipaddress.IPv4Address
) -> ipaddress.IPv4Address:
    value = ipam.get(key)
    if value is None:
        return default
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise CNIError(
            ERR_INVALID_CONFIG, f'invalid "ipam.{key}" {value!r}: not an IPv4 address'
        ) from None
    if address not in subnet or address in (subnet.network_address, subnet.broadcast_address):
        raise CNIError(
            ERR_INVALID_CONFIG, f'"ipam.{key}" {value} is not a usable address of {subnet}'
        )
    return address


def _routes(value: Any) -> tuple[IPAMRoute, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CNIError(ERR_INVALID_CONFIG, f'"ipam.routes" must be a list, got {value!r}')
    routes = []
    for i, raw in enumerate(value):
        where = f"ipam.routes[{i}]"
        if not isinstance(raw, dict):
            raise CNIError(ERR_INVALID_CONFIG, f'"{where}" must be an object, got {raw!r}')
        try:
            dst = ipaddress.ip_network(raw.get("dst"))
            gw = ipaddress.ip_address(raw["gw"]) if raw.get("gw") else None
        except (TypeError, ValueError) as err:
            raise CNIError(ERR_INVALID_CONFIG, f'invalid "{where}" {raw!r}: {err}') from None
        if not isinstance(dst, ipaddress.IPv4Network) or not isinstance(
            gw, ipaddress.IPv4Address | None
        ):
            raise CNIError(ERR_UNSUPPORTED_FIELD, f'"{where}": {raw!r}: only IPv4 is supported')
        routes.append(IPAMRoute(dst, gw))
    return tuple(routes)
