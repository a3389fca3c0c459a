#!/usr/bin/env python3
"""Slow HTTP clients, run inside a pod's namespace (standard library only).

trickle.py IP PORT COUNT GAP SECONDS

Keeps COUNT connections open to IP:PORT for SECONDS, each sending one more byte
of an HTTP request every GAP seconds and never finishing it. A connection the
server closes is opened again a second later, as a patient attacker would.
Prints, at the end, one JSON line: {"opened": connections the server accepted,
"failed": connects that failed, "closed": connections the server closed,
"held": connections still open at the end, "longest": the longest a connection
stayed open (seconds)}.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import time

HEAD = b"GET /healthz HTTP/1.1\r\nHost: node\r\n"
FOREVER = b"X-Slow: 1\r\n"  # header lines after HEAD: the request never ends
REOPEN_AFTER = 1.0  # seconds between a closed connection and its replacement
CONNECT_TIMEOUT = 2.0


def request_byte(index: int) -> bytes:
    if index < len(HEAD):
        return HEAD[index : index + 1]
    at = (index - len(HEAD)) % len(FOREVER)
    return FOREVER[at : at + 1]


def main(address: str, port: int, count: int, gap: float, seconds: float) -> None:
    opened = failed = closed = 0
    longest = 0.0
    # socket -> [opened at, bytes sent, next byte due]
    open_: dict[socket.socket, list[float]] = {}
    reopen_at: list[float] = [0.0] * count  # one slot per wanted connection
    end = time.monotonic() + seconds

    def close(sock: socket.socket) -> None:
        nonlocal closed, longest
        started = open_.pop(sock)[0]
        longest = max(longest, time.monotonic() - started)
        sock.close()
        closed += 1
        reopen_at.append(time.monotonic() + REOPEN_AFTER)

    while time.monotonic() < end:
        now = time.monotonic()
        due = [at for at in reopen_at if at <= now]
        reopen_at[:] = [at for at in reopen_at if at > now]
        for _ in due:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect((address, port))
            except OSError:
                sock.close()
                failed += 1
                reopen_at.append(time.monotonic() + REOPEN_AFTER)
                continue
            sock.setblocking(False)
            open_[sock] = [time.monotonic(), 0, time.monotonic()]
            opened += 1
        readable, _, _ = select.select(list(open_), [], [], 0.2)
        for sock in readable:  # the server closed it (or answered: the end either way)
            with contextlib.suppress(OSError):
                sock.recv(65536)
            close(sock)
        now = time.monotonic()
        for sock, state in list(open_.items()):
            if state[2] > now:
                continue
            try:
                sock.send(request_byte(int(state[1])))
            except OSError:
                close(sock)
                continue
            state[1] += 1
            state[2] = now + gap
    now = time.monotonic()
    held = len(open_)
    for sock, state in open_.items():
        longest = max(longest, now - state[0])
        sock.close()
    report = {"opened": opened, "failed": failed, "closed": closed, "held": held}
    print(json.dumps({**report, "longest": round(longest, 1)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
