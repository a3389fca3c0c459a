"""Traffic run inside the pods (through ip netns exec): servers, RR, CRR, a probe.

    python bench/dpbench/traffic.py _serve RR_PORT CRR_PORT
    python bench/dpbench/traffic.py _rr|_crr HOST PORT SECONDS
    python bench/dpbench/traffic.py _probe HOST PORT

Each client prints its measurement as one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable


def serve(rr_port: int, crr_port: int) -> None:
    """The RR and CRR servers: one thread each, until killed."""

    def listener(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(512)
        return sock

    def rr(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                recv, send = conn.recv, conn.send
                while data := recv(1):
                    send(data)

    def crr(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            with conn, contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if data := conn.recv(1):
                    conn.send(data)

    rr_sock, crr_sock = listener(rr_port), listener(crr_port)
    threading.Thread(target=crr, args=(crr_sock,), daemon=True).start()
    rr(rr_sock)


def rr_client(host: str, port: int, seconds: float) -> dict:
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send, recv, clock = sock.send, sock.recv, time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    start = now = clock()
    deadline = start + int(seconds * 1e9)
    while now < deadline:
        send(b"x")
        if not recv(1):
            raise ConnectionError("the RR server closed the connection")
        later = clock()
        append(later - now)
        now = later
    sock.close()
    samples.sort()
    n = len(samples)
    return {
        "transactions_per_s": n / ((now - start) / 1e9),
        "mean_us": sum(samples) / n / 1e3,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[min(n - 1, n * 99 // 100)] / 1e3,
        "max_us": samples[-1] / 1e3,
    }


def crr_client(host: str, port: int, seconds: float) -> dict:
    linger = struct.pack("ii", 1, 0)  # close with RST: no TIME_WAIT, no port exhaustion
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect((host, port))
        sock.send(b"x")
        if not sock.recv(1):
            raise ConnectionError("the CRR server closed the connection early")
        sock.close()
        count += 1
    return {"connections_per_s": count / (time.perf_counter() - start)}


def probe(host: str, port: int) -> dict:
    """How a connection attempt ends: connected, refused (RST) or timeout (dropped)."""
    try:
        socket.create_connection((host, port), timeout=1.5).close()
        return {"outcome": "connected"}
    except ConnectionRefusedError:
        return {"outcome": "refused"}
    except TimeoutError:
        return {"outcome": "timeout"}


HELPERS: dict[str, Callable[..., dict | None]] = {
    "_serve": lambda rr, crr: serve(int(rr), int(crr)),
    "_rr": lambda host, port, s: rr_client(host, int(port), float(s)),
    "_crr": lambda host, port, s: crr_client(host, int(port), float(s)),
    "_probe": lambda host, port: probe(host, int(port)),
}


def main() -> None:
    answer = HELPERS[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
