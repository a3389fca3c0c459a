"""Ethernet frames built by hand, for BPF_PROG_TEST_RUN and raw sockets (stdlib only)."""

from __future__ import annotations

import socket
import struct

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10
ETH_IP, ETH_ARP, ETH_IPV6, ETH_VLAN = 0x0800, 0x0806, 0x86DD, 0x8100
POD_MAC, NODE_MAC = b"\x02\x00\x00\x00\x00\x01", b"\xee\xee\xee\xee\xee\xee"


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def ipv4(
    src: str,
    dst: str,
    proto: int,
    payload: bytes,
    *,
    ident: int = 1,
    frag: int = 0,
    options: bytes = b"",
    tot_len: int | None = None,
) -> bytes:
    ihl = 5 + len(options) // 4
    header = (
        struct.pack(
            "!BBHHHBBH4s4s",
            0x40 | ihl,
            0,
            tot_len if tot_len is not None else ihl * 4 + len(payload),
            ident,
            frag,
            64,
            proto,
            0,
            socket.inet_aton(src),
            socket.inet_aton(dst),
        )
        + options
    )
    return header[:10] + struct.pack("!H", checksum(header)) + header[12:] + payload


def tcp(sport: int, dport: int, flags: int = TCP_SYN, payload: bytes = b"") -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, flags, 65535, 0, 0) + payload


def udp(sport: int, dport: int, payload: bytes = b"x") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def icmp(kind: int, code: int = 0, rest: bytes = b"\0\0\0\0", payload: bytes = b"") -> bytes:
    body = struct.pack("!BBH", kind, code, 0) + rest + payload
    return body[:2] + struct.pack("!H", checksum(body)) + body[4:]


def echo(request: bool, ident: int, seq: int = 1) -> bytes:
    return icmp(8 if request else 0, 0, struct.pack("!HH", ident, seq), b"ping")


def icmp_error(quoted: bytes, quote_l4: int = 8, kind: int = 3, code: int = 3) -> bytes:
    """Destination unreachable (or ``kind``) quoting an IPv4 packet's header and
    ``quote_l4`` bytes of what follows it."""
    ihl = (quoted[0] & 0xF) * 4
    return icmp(kind, code, b"\0\0\0\0", quoted[: ihl + quote_l4])


def eth(payload: bytes, proto: int = ETH_IP, src: bytes = POD_MAC, dst: bytes = NODE_MAC) -> bytes:
    return dst + src + struct.pack("!H", proto) + payload


def vlan(payload: bytes, proto: int, *tags: int) -> bytes:
    """An Ethernet frame with 802.1Q tags (outermost first) before ``proto``."""
    body = b""
    for i, tag in enumerate(tags):
        inner = tags[i + 1] if i + 1 < len(tags) else None
        body += struct.pack("!HH", tag, ETH_VLAN if inner is not None else proto)
    return NODE_MAC + POD_MAC + struct.pack("!H", ETH_VLAN) + body + payload


def arp(sender: str, target: str, mac: bytes = POD_MAC) -> bytes:
    return eth(
        struct.pack("!HHBBH", 1, ETH_IP, 6, 4, 1)
        + mac
        + socket.inet_aton(sender)
        + b"\0" * 6
        + socket.inet_aton(target),
        ETH_ARP,
        dst=b"\xff" * 6,
    )


def ipv6_udp(src: str, dst: str, sport: int, dport: int) -> bytes:
    payload = udp(sport, dport)
    header = struct.pack("!IHBB", 6 << 28, len(payload), 17, 64)
    return eth(
        header
        + socket.inet_pton(socket.AF_INET6, src)
        + socket.inet_pton(socket.AF_INET6, dst)
        + payload,
        ETH_IPV6,
    )
