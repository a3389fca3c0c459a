#!/usr/bin/env python3
"""Probe many (address, port, protocol) targets at once from one pod's namespace.

    matrix_probe.py TARGETS_JSON [TIMEOUT]

TARGETS_JSON is a list of [address, port, "tcp"|"udp"]; prints a JSON list of
booleans in the same order. TCP: a connection whose echo comes back (the
servers are netprobe.py's); UDP: an "ask" whose "answer" comes back.
Standard library only: it runs inside pod namespaces with the system Python.
"""

from __future__ import annotations

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor


def tcp(address: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.sendall(b"ping")
            return s.recv(4) == b"ping"
    except OSError:
        return False


def udp(address: str, port: int, timeout: float) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout / 3)
        for _ in range(3):
            try:
                s.sendto(b"ask", (address, port))
                if s.recv(16) == b"answer":
                    return True
            except OSError:
                continue
    return False


def main() -> int:
    targets = json.loads(sys.argv[1])
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    probes = {"tcp": tcp, "udp": udp}
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        results = list(pool.map(lambda t: probes[t[2]](t[0], int(t[1]), timeout), targets))
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
