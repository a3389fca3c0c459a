"""The agent's socket protocol: length-prefixed JSON frames, one request and one
answer per connection.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON.
Requests carry ``op`` (``cni``, ``apply``, ``delete``, ``get``, ``explain``,
``status``); a CNI call carries the runtime's environment and its stdin
(base64, so any bytes survive), and its answer the exit code, stdout and
stderr the plugin would have produced. Standard library only.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from typing import Any

VERSION = 1
MAX_REQUEST = 1 << 20  # 1 MiB: a CNI config with a large prevResult fits easily
MAX_ANSWER = 64 << 20  # listings of many endpoints and policies
LENGTH = struct.Struct(">I")


class WireError(Exception):
    """The peer broke the protocol (size, framing, JSON, fields)."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(LENGTH.pack(len(body)) + body)


def receive(sock: socket.socket, limit: int) -> dict[str, Any]:
    (length,) = LENGTH.unpack(_exactly(sock, LENGTH.size))
    if length > limit:
        raise WireError(f"message of {length} bytes is over the limit of {limit}")
    try:
        message = json.loads(_exactly(sock, length))
    except (UnicodeDecodeError, ValueError) as err:
        raise WireError(f"message is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise WireError("message is not a JSON object")
    return message


def _exactly(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(min(count, 1 << 16))
        if not chunk:
            raise WireError("connection closed mid-message")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def cni_request(env: dict[str, str], stdin: bytes) -> dict[str, Any]:
    return {"v": VERSION, "op": "cni", "env": env, "stdin": base64.b64encode(stdin).decode()}


def cni_stdin(request: dict[str, Any]) -> bytes:
    try:
        return base64.b64decode(request.get("stdin", ""), validate=True)
    except (ValueError, TypeError) as err:
        raise WireError(f"stdin is not base64: {err}") from None
