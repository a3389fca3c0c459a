#!/usr/bin/env python3
"""Traffic for the datapath tests, run inside a pod's namespace (standard library only).

netprobe.py serve --tcp 8080,8081 --udp 5000     echo TCP, count UDP; prints "ready",
                                                 then the counts as JSON on stdin EOF; a
                                                 "sources" line on stdin prints what came
                                                 from where so far: [[proto, port, source
                                                 address, connections or datagrams], ...]
netprobe.py connect IP PORT [--timeout S]        exit 0 if a TCP echo came back
netprobe.py udp IP PORT [--count N]              N datagrams, each from a new port
netprobe.py udp-stream IP PORTS SECONDS          datagrams to the ports in turn, each from
                                                 a new port; prints how many went to each
netprobe.py udp-ask IP PORT                      exit 0 if a UDP answer came back
netprobe.py udp-refused IP PORT                  exit 0 if ICMP port unreachable came back
netprobe.py big-udp IP PORT SIZE                 one datagram of SIZE bytes (fragments)
netprobe.py options IP PORT                      UDP with an IPv4 option (ihl > 5)
netprobe.py fragment SRC DST PORT                a lone non-first fragment (raw socket)
netprobe.py arp SENDER TARGET                    an ARP request on eth0 claiming SENDER
netprobe.py frame HEX [--vnet]                   a raw Ethernet frame on eth0 (--vnet: through
                                                 a virtio-net header, so a frame of a page or
                                                 more is built with only its Ethernet header
                                                 in the skb's linear part)
netprobe.py send-from SRC IP PORT [--count N]    UDP datagrams from the local address SRC
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time


def serve(tcp_ports: list[int], udp_ports: list[int]) -> None:
    counts: dict[str, dict[int, int]] = {
        "tcp": dict.fromkeys(tcp_ports, 0),
        "udp": dict.fromkeys(udp_ports, 0),
    }
    sources: dict[tuple[str, int, str], int] = {}
    lock = threading.Lock()

    def count(proto: str, port: int, source: str) -> None:
        with lock:
            counts[proto][port] += 1
            sources[(proto, port, source)] = sources.get((proto, port, source), 0) + 1

    def tcp_loop(port: int) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(64)
        ready.release()
        while True:
            conn, peer = srv.accept()
            count("tcp", port, peer[0])
            threading.Thread(target=echo, args=(conn, port), daemon=True).start()

    def echo(conn: socket.socket, port: int) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def udp_loop(port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(("0.0.0.0", port))
        ready.release()
        while True:
            data, peer = sock.recvfrom(65535)
            count("udp", port, peer[0])
            if data.startswith(b"ask"):
                sock.sendto(b"answer", peer)

    ready = threading.Semaphore(0)
    for port in tcp_ports:
        threading.Thread(target=tcp_loop, args=(port,), daemon=True).start()
    for port in udp_ports:
        threading.Thread(target=udp_loop, args=(port,), daemon=True).start()
    for _ in range(len(tcp_ports) + len(udp_ports)):
        ready.acquire()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "sources":
            with lock:
                listed = [[*key, n] for key, n in sorted(sources.items())]
            print(json.dumps(listed), flush=True)
    with lock:
        print(json.dumps(counts), flush=True)


def connect(ip: str, port: int, timeout: float) -> int:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.sendall(b"ping")
            return 0 if s.recv(4) == b"ping" else 1
    except OSError:
        return 1


def udp(ip: str, port: int, count: int) -> int:
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", (ip, port))
    return 0


def udp_stream(ip: str, ports: list[int], seconds: float) -> int:
    sent = dict.fromkeys(ports, 0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"x", (ip, port))
            sent[port] += 1
        time.sleep(0.0005)
    print(json.dumps(sent), flush=True)
    return 0


def udp_ask(ip: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1)
        for _ in range(3):
            s.sendto(b"ask", (ip, port))
            try:
                return 0 if s.recv(16) == b"answer" else 1
            except TimeoutError:
                continue
    return 1


def udp_refused(ip: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.5)
        s.connect((ip, port))
        s.send(b"x")
        try:
            s.recv(16)
        except ConnectionRefusedError:
            return 0
        except TimeoutError:
            return 1
    return 1


def big_udp(ip: str, port: int, size: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"f" * size, (ip, port))
    return 0


def options(ip: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # Router alert (4 bytes): the IPv4 header grows to 24 bytes.
        s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, b"\x94\x04\x00\x00")
        s.sendto(b"o", (ip, port))
    return 0


def checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def fragment(src: str, dst: str, port: int) -> int:
    """A later fragment whose payload looks like a UDP header to ``port``."""
    payload = struct.pack("!HHHH", 40000, port, 16, 0) + b"payload!"
    offset_units = 185  # 1480 bytes into the datagram
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(payload),
        0x4242,
        offset_units,
        64,
        socket.IPPROTO_UDP,
        0,
        socket.inet_aton(src),
        socket.inet_aton(dst),
    )
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        s.sendto(header + payload, (dst, 0))
    return 0


def arp(sender: str, target: str) -> int:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind(("eth0", 0))
        mac = s.getsockname()[4]
        frame = (
            b"\xff" * 6
            + mac
            + struct.pack("!H", 0x0806)
            + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
            + mac
            + socket.inet_aton(sender)
            + b"\x00" * 6
            + socket.inet_aton(target)
        )
        s.send(frame)
    return 0


SOL_PACKET, PACKET_VNET_HDR = 263, 15


def frame(data: bytes, vnet: bool) -> int:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        if vnet:
            s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            data = bytes(10) + data  # struct virtio_net_hdr: no offload, no GSO
        s.bind(("eth0", 0))
        s.send(data)
    return 0


def send_from(src: str, ip: str, port: int, count: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((src, 0))
        for _ in range(count):
            s.sendto(b"x", (ip, port))
    return 0


def main() -> int:
    args = sys.argv[1:]
    command = args.pop(0)
    if command == "serve":
        opts = dict(zip(args[::2], args[1::2], strict=True))
        ports = {k: [int(p) for p in opts.get(k, "").split(",") if p] for k in ("--tcp", "--udp")}
        serve(ports["--tcp"], ports["--udp"])
        return 0
    if command == "connect":
        timeout = float(args[3]) if len(args) > 3 else 1.5
        return connect(args[0], int(args[1]), timeout)
    if command == "udp":
        return udp(args[0], int(args[1]), int(args[3]) if len(args) > 3 else 1)
    if command == "udp-stream":
        return udp_stream(args[0], [int(p) for p in args[1].split(",")], float(args[2]))
    if command == "udp-ask":
        return udp_ask(args[0], int(args[1]))
    if command == "udp-refused":
        return udp_refused(args[0], int(args[1]))
    if command == "big-udp":
        return big_udp(args[0], int(args[1]), int(args[2]))
    if command == "options":
        return options(args[0], int(args[1]))
    if command == "arp":
        return arp(args[0], args[1])
    if command == "frame":
        return frame(bytes.fromhex(args[0]), "--vnet" in args)
    if command == "send-from":
        return send_from(args[0], args[1], int(args[2]), int(args[4]) if len(args) > 4 else 1)
    if command == "fragment":
        return fragment(args[0], args[1], int(args[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
