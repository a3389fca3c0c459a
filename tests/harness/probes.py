"""Real packets between namespaces: who a UDP datagram arrives from."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

PYTHON = "/usr/bin/python3"

RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(10)
print("ready", flush=True)
data, peer = s.recvfrom(100)
print(peer[0], flush=True)
"""

SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(20):
    s.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
"""


def node_address() -> str:
    """The node's first global IPv4 address (what pods see as the node)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[3].split("/")[0]


def _netns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", Path(netns).name] if netns else []


def udp_source_seen(
    sender_netns: str | None, receiver_netns: str | None, address: str, port: int = 5300
) -> str:
    """Send a datagram from one namespace to ``address``; return the source the receiver saw."""
    receiver = subprocess.Popen(
        [*_netns_prefix(receiver_netns), PYTHON, "-c", RECEIVER, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while receiver.poll() is None and time.monotonic() < deadline:
            subprocess.run(
                [*_netns_prefix(sender_netns), PYTHON, "-c", SENDER, address, str(port)],
                check=True,
                timeout=10,
            )
            time.sleep(0.1)
        out, err = receiver.communicate(timeout=10)
        assert receiver.returncode == 0, err
        return out.strip()
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
