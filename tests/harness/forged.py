#!/usr/bin/env python3
"""Hostile packets for the tests of the node network and the tunnel, sent for real from
whatever network namespace runs this (the system Python; standard library only).

    forged.py vxlan TO PORT VNI INNER_DST_MAC INNER_SRC_MAC INNER_SRC INNER_DST INNER_DPORT COUNT
              [OUTER_SRC]
        COUNT VXLAN datagrams to TO:PORT, each one sendto (never cut at a newline): a
        VXLAN header with VNI, an inner Ethernet frame from INNER_SRC_MAC to
        INNER_DST_MAC (a node computes every tunnel MAC from an address), inside it IPv4
        UDP from INNER_SRC to INNER_DST:INNER_DPORT saying "ask". With OUTER_SRC the
        outer IPv4 header is written by hand too (a raw socket), with that source.
    forged.py udp SRC DST DPORT COUNT
        COUNT UDP datagrams "ask" from SRC (any address: a raw socket) to DST:DPORT.
    forged.py big-udp DST DPORT SIZE
        one UDP datagram of SIZE bytes without DF: the sender's kernel fragments it.
    forged.py fragmented-syn DST DPORT
        a TCP SYN (with 40 bytes of data) in two IPv4 fragments, from this host's address.
    forged.py count-syns IFACE SRC DPORT SECONDS
        listens on IFACE (AF_PACKET) for SECONDS and prints how many TCP SYNs from SRC to
        DPORT arrived, and how many IPv4 fragments from SRC.

Checksums are computed where a receiver checks them (IPv4 headers, TCP); UDP over IPv4
may carry none.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

IPPROTO_UDP, IPPROTO_TCP = 17, 6


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total >> 16) + (total & 0xFFFF)
    return ~total & 0xFFFF


def ipv4(
    src: str, dst: str, proto: int, payload: bytes, ident: int = 0x5151, frag: int = 0
) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident, frag, 64, proto, 0,
        socket.inet_aton(src), socket.inet_aton(dst),
    )  # fmt: skip
    return header[:10] + struct.pack("!H", checksum(header)) + header[12:] + payload


def udp_datagram(sport: int, dport: int, data: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data


def raw_send(packet: bytes, dst: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        s.sendto(packet, (dst, 0))


def vxlan(args: list[str]) -> int:
    to, port, vni, dst_mac, src_mac, inner_src, inner_dst, inner_dport, count = args[:9]
    outer_src = args[9] if len(args) > 9 else None
    inner = ipv4(inner_src, inner_dst, IPPROTO_UDP, udp_datagram(40000, int(inner_dport), b"ask"))
    frame = bytes.fromhex(dst_mac.replace(":", "") + src_mac.replace(":", "")) + b"\x08\x00" + inner
    payload = struct.pack("!BBBBI", 0x08, 0, 0, 0, int(vni) << 8) + frame
    for _ in range(int(count)):
        if outer_src is None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(payload, (to, int(port)))
        else:
            raw_send(ipv4(outer_src, to, IPPROTO_UDP, udp_datagram(40001, int(port), payload)), to)
        time.sleep(0.02)
    return 0


def udp(args: list[str]) -> int:
    src, dst, dport, count = args
    for _ in range(int(count)):
        raw_send(ipv4(src, dst, IPPROTO_UDP, udp_datagram(40002, int(dport), b"ask")), dst)
        time.sleep(0.02)
    return 0


def big_udp(args: list[str]) -> int:
    dst, dport, size = args
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, 10, 0)  # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: no DF
        s.sendto(b"b" * int(size), (dst, int(dport)))
    return 0


def fragmented_syn(args: list[str]) -> int:
    dst, dport = args
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((dst, int(dport)))
        src = probe.getsockname()[0]
    data = b"s" * 40
    header = struct.pack("!HHIIBBHHH", 40003, int(dport), 0x1000, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = struct.pack("!4s4sBBH", socket.inet_aton(src), socket.inet_aton(dst), 0, IPPROTO_TCP,
                         len(header) + len(data))  # fmt: skip
    tcp = header[:16] + struct.pack("!H", checksum(pseudo + header + data)) + header[18:] + data
    first, rest = tcp[:24], tcp[24:]  # 24 bytes: a multiple of 8, the whole TCP header
    raw_send(ipv4(src, dst, IPPROTO_TCP, first, 0x5353, 0x2000), dst)  # more fragments
    raw_send(ipv4(src, dst, IPPROTO_TCP, rest, 0x5353, len(first) // 8), dst)
    return 0


def count_syns(args: list[str]) -> int:
    iface, src, dport, seconds = args
    syns = fragments = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800)) as s:
        s.bind((iface, 0))
        s.settimeout(0.2)
        deadline = time.monotonic() + float(seconds)
        while time.monotonic() < deadline:
            try:
                frame = s.recv(65535)
            except TimeoutError:
                continue
            ip = frame[14:]
            if len(ip) < 20 or socket.inet_ntoa(ip[12:16]) != src:
                continue
            frag = struct.unpack("!H", ip[6:8])[0]
            if frag & 0x3FFF:
                fragments += 1
            ihl = (ip[0] & 0xF) * 4
            if ip[9] == IPPROTO_TCP and not frag & 0x1FFF and len(ip) >= ihl + 14:
                port = struct.unpack("!H", ip[ihl + 2 : ihl + 4])[0]
                if port == int(dport) and ip[ihl + 13] & 0x02:
                    syns += 1
    print(f"{syns} {fragments}", flush=True)
    return 0


COMMANDS = {
    "vxlan": vxlan,
    "udp": udp,
    "big-udp": big_udp,
    "fragmented-syn": fragmented_syn,
    "count-syns": count_syns,
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
