"""The rtnetlink messages sluice sends and reads (links, addresses, routes,
neighbours, and the clsact qdisc and bpf filters of ``"attach": "tc"``),
packed and unpacked with ``struct``.

pyroute2's message classes know every attribute of every family, and importing
them loads multiprocessing, platform, pkgutil and a plugin per link kind: more
than a plugin process spends on the rest of an ADD's kernel work. sluice needs
a dozen attributes, so it builds them here. An answer reads like pyroute2's:
header fields by name (``msg["index"]``), attributes by the kernel's name
(``msg.get("IFLA_IFNAME")``), None when absent.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost a one-call process
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

ATTR = struct.Struct("=HH")  # length, type
U32 = struct.Struct("=I")
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

# Fixed headers after nlmsghdr, and the names of their fields.
IFINFMSG = struct.Struct("=BxHiII")
IFINFMSG_FIELDS = ("family", "ifi_type", "index", "flags", "change")
IFADDRMSG = struct.Struct("=BBBBI")
IFADDRMSG_FIELDS = ("family", "prefixlen", "flags", "scope", "index")
RTMSG = struct.Struct("=BBBBBBBBI")
RTMSG_FIELDS = ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags")
NDMSG = struct.Struct("=BxxxiHBB")
NDMSG_FIELDS = ("family", "ifindex", "state", "flags", "ndm_type")
TCMSG = struct.Struct("=BxxxiIII")
TCMSG_FIELDS = ("family", "index", "handle", "parent", "info")


class Message:
    """A decoded rtnetlink message: its fixed header's fields and its attributes."""

    __slots__ = ("attrs", "fields")

    def __init__(self, fields: dict[str, int], attrs: dict[str, Any]) -> None:
        self.fields = fields
        self.attrs = attrs

    def __getitem__(self, name: str) -> int:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def __repr__(self) -> str:
        return f"Message({self.fields!r}, {self.attrs!r})"


# -- values ---------------------------------------------------------------------------


def _u32(data: bytes) -> int:
    return U32.unpack_from(data)[0]


def _str(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode(errors="replace")


def _ip(data: bytes) -> str:
    return _socket.inet_ntop(_socket.AF_INET if len(data) == 4 else _socket.AF_INET6, data)


def _mac(data: bytes) -> str:
    return ":".join(f"{b:02x}" for b in data)


def _linkinfo(data: bytes) -> Message:
    return Message({}, decode_attrs(data, LINKINFO_ATTRS))


# type -> (name, decoder), per family of attributes; others are skipped.
Decoders = dict[int, tuple[str, "Callable[[bytes], Any]"]]
LINKINFO_ATTRS: Decoders = {1: ("IFLA_INFO_KIND", _str)}
LINK_ATTRS: Decoders = {
    1: ("IFLA_ADDRESS", _mac),
    3: ("IFLA_IFNAME", _str),
    4: ("IFLA_MTU", _u32),
    18: ("IFLA_LINKINFO", _linkinfo),
    20: ("IFLA_IFALIAS", _str),
}
ADDRESS_ATTRS: Decoders = {
    1: ("IFA_ADDRESS", _ip),
    2: ("IFA_LOCAL", _ip),
    8: ("IFA_FLAGS", _u32),
}
ROUTE_ATTRS: Decoders = {
    1: ("RTA_DST", _ip),
    4: ("RTA_OIF", _u32),
    5: ("RTA_GATEWAY", _ip),
    6: ("RTA_PRIORITY", _u32),
    15: ("RTA_TABLE", _u32),
}
NEIGHBOR_ATTRS: Decoders = {
    1: ("NDA_DST", _ip),
    2: ("NDA_LLADDR", _mac),
    8: ("NDA_IFINDEX", _u32),
}


def _tc_options(data: bytes) -> Message:
    return Message({}, decode_attrs(data, BPF_OPTION_ATTRS))


# TCA_OPTIONS is read as a bpf filter's (only those are looked at: see TCA_KIND).
BPF_OPTION_ATTRS: Decoders = {7: ("TCA_BPF_NAME", _str), 11: ("TCA_BPF_ID", _u32)}
TC_ATTRS: Decoders = {1: ("TCA_KIND", _str), 2: ("TCA_OPTIONS", _tc_options)}


def decode_attrs(data: bytes, decoders: Decoders, offset: int = 0) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    while offset + ATTR.size <= len(data):
        length, kind = ATTR.unpack_from(data, offset)
        if length < ATTR.size:
            break
        known = decoders.get(kind & NLA_TYPE_MASK)
        if known is not None:
            name, decode = known
            attrs[name] = decode(data[offset + ATTR.size : offset + length])
        offset += (length + 3) & ~3
    return attrs


def decode(
    body: bytes, header: struct.Struct, names: tuple[str, ...], decoders: Decoders
) -> Message:
    """A message from what follows its nlmsghdr."""
    fields = dict(zip(names, header.unpack_from(body), strict=True))
    return Message(fields, decode_attrs(body, decoders, header.size))


# -- encoding ---------------------------------------------------------------------------


def attr(kind: int, payload: bytes) -> bytes:
    length = ATTR.size + len(payload)
    return ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def attrs(pairs: Iterable[tuple[int, bytes]]) -> bytes:
    return b"".join(attr(kind, payload) for kind, payload in pairs)


def u32(value: int) -> bytes:
    return U32.pack(value)


def asciiz(value: str) -> bytes:
    return value.encode() + b"\0"


def ipv4(address: str) -> bytes:
    return _socket.inet_pton(_socket.AF_INET, address)


def mac(address: str) -> bytes:
    return bytes.fromhex(address.replace(":", ""))
