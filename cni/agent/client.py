"""Talking to the agent: the plugin's forwarding and sluicectl's requests.

Standard library only (the ``sluice`` executable imports this on every call).
"""

from __future__ import annotations

import socket
from typing import Any

from cni.agent import wire

CONNECT_TIMEOUT = 10.0  # a busy agent accepts late; a missing one fails at once


class AgentUnavailable(Exception):
    """Nobody answers on the socket (no agent, or it died mid-call)."""


def call(path: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Send one request and return the answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as err:
            raise AgentUnavailable(f'no agent on "{path}": {err.strerror or err}') from None
        sock.settimeout(timeout)
        try:
            wire.send(sock, request)
            return wire.receive(sock, wire.MAX_ANSWER)
        except (OSError, wire.WireError) as err:
            raise AgentUnavailable(f'the agent on "{path}" did not answer: {err}') from None
    finally:
        sock.close()


def forward(path: str, env: dict[str, str], stdin: bytes) -> tuple[int, str, str]:
    """Run one CNI call in the agent: (exit code, stdout, stderr)."""
    answer = call(path, wire.cni_request(env, stdin))
    return int(answer.get("rc", 1)), str(answer.get("stdout", "")), str(answer.get("stderr", ""))
