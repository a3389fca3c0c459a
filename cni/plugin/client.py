"""Talking to the agent: the plugin's forwarding and sluicectl's requests.

The forwarding path runs in the ``sluice`` executable on every call, so it
uses the ``_socket`` built-in directly: the ``socket`` module's Python layer
imports selectors, collections, enum and more, which would cost more than
the call itself.
"""

import _socket

from cni.plugin import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

CONNECT_TIMEOUT = 10.0  # a busy agent accepts late; a missing one fails at once


class AgentUnavailable(Exception):
    """Nobody answers on the socket (no agent, or it died mid-call)."""


def exchange(path: str, body: bytes, timeout: float | None = None) -> bytes:
    """Send one frame and return the answer's body."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as err:
            raise AgentUnavailable(f'no agent on "{path}": {err.strerror or err}') from None
        sock.settimeout(timeout)
        try:
            wire.send_frame(sock, body)
            return wire.receive_frame(sock, wire.MAX_ANSWER)
        except (OSError, wire.WireError) as err:
            raise AgentUnavailable(f'the agent on "{path}" did not answer: {err}') from None
    finally:
        sock.close()


def forward(
    path: str, env: "Mapping[str, str] | Mapping[bytes, bytes]", stdin: bytes
) -> tuple[int, str, str]:
    """Run one CNI call in the agent: (exit code, stdout, stderr)."""
    answer = exchange(path, wire.call_frame(env, stdin))
    try:
        return wire.parse_answer(answer)
    except wire.WireError:
        refusal = answer[:200]
        raise AgentUnavailable(f'the agent on "{path}" refused the call: {refusal!r}') from None


def call(path: str, request: "dict[str, Any]", timeout: float | None = None) -> "dict[str, Any]":
    """One of sluicectl's requests (JSON) and its answer."""
    import json

    body = json.dumps(request, separators=(",", ":")).encode()
    try:
        return wire.decode(exchange(path, body, timeout))
    except wire.WireError as err:
        raise AgentUnavailable(f'the agent on "{path}" answered garbage: {err}') from None
