"""IP addresses and CIDRs as the API server accepts them in its legacy fields.

The API server parses ``ipBlock.cidr``, ``except``, pod and Service addresses with
Go's pre-1.17 parser (``netutils.ParseCIDRSloppy``): IPv4 fields may have leading
zeros, read as decimal (``010.0.0.0/8`` is ``10.0.0.0/8``), and so may prefix
lengths. Python's ``ipaddress`` refuses leading zeros (they could be octal), so
the text is brought to canonical form first.

One form the API server accepts is refused here: an IPv4-mapped IPv6 CIDR
(``::ffff:10.1.0.0/112``). The API server's own validation compares its prefix
length as IPv6 (112 bits) while Go matches addresses against it as IPv4 (a /16),
so what it means depends on who reads it; sluice does not guess (a rule that
holds one is refused, see ``fields``).
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAPPED_PREFIX = 96  # ::ffff:0:0/96 holds the IPv4-mapped addresses
MAPPED_REFUSAL = (
    "is an IPv4-mapped IPv6 CIDR, which the API server compares as IPv6 and matches as "
    "IPv4: write it as IPv4"
)


def _decimal_ipv4(text: str) -> str | None:
    """Dotted decimal with leading zeros allowed, canonical; None if it is not one."""
    fields = text.split(".")
    if len(fields) != 4 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    values = [int(f) for f in fields]
    if any(v > 255 for v in values):
        return None
    return ".".join(map(str, values))


def _canonical(text: str) -> str:
    if ":" not in text:
        return _decimal_ipv4(text) or text
    head, sep, tail = text.rpartition(":")
    if "." in tail:  # IPv6 ending in an embedded IPv4 address
        tail = _decimal_ipv4(tail) or tail
    return head + sep + tail


def legacy_ip(text: str) -> IPAddress:
    """An address as the API server reads it; ValueError if it does not."""
    return ipaddress.ip_address(_canonical(text))


def legacy_cidr(text: str) -> IPNetwork:
    """A CIDR as the API server reads it (host bits may be set); ValueError if it does
    not, or if it is an IPv4-mapped IPv6 CIDR (see the module's docstring)."""
    address, slash, length = text.partition("/")
    if not slash or not length.isascii() or not length.isdigit():
        raise ValueError(f"{text!r} is not a CIDR")
    network = ipaddress.ip_network(f"{_canonical(address)}/{int(length)}", strict=False)
    if (
        isinstance(network, ipaddress.IPv6Network)
        and network.prefixlen >= MAPPED_PREFIX
        and network.network_address.ipv4_mapped is not None
    ):
        raise ValueError(MAPPED_REFUSAL)
    return network
