"""The Node object, cut to what the route keeper reads: its name, its IPv4 pod
ranges (``spec.podCIDRs``, or ``spec.podCIDR`` from servers that set only that)
and its IPv4 InternalIP (``status.addresses``).

Whatever cannot be read is left out rather than refused: a Node without a
usable range or address simply gets no route.
"""

from __future__ import annotations

import ipaddress
from typing import Any, NamedTuple

PATH = "/api/v1/nodes"
INTERNAL_IP = "InternalIP"


class NodeAddressing(NamedTuple):
    name: str
    pod_cidrs: tuple[ipaddress.IPv4Network, ...]
    internal_ip: ipaddress.IPv4Address | None


def parse_node(obj: dict[str, Any]) -> NodeAddressing:
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    texts = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    cidrs = []
    for text in texts:
        try:
            network = ipaddress.ip_network(text)
        except (TypeError, ValueError):
            continue
        if isinstance(network, ipaddress.IPv4Network):
            cidrs.append(network)
    return NodeAddressing(str(metadata.get("name") or ""), tuple(cidrs), _internal_ip(status))


def _internal_ip(status: dict[str, Any]) -> ipaddress.IPv4Address | None:
    for entry in status.get("addresses") or []:
        if not isinstance(entry, dict) or entry.get("type") != INTERNAL_IP:
            continue
        try:
            address = ipaddress.ip_address(str(entry.get("address", "")))
        except (TypeError, ValueError):
            continue
        if isinstance(address, ipaddress.IPv4Address):
            return address
    return None
