"""The agent's socket protocol: one length-prefixed frame each way per connection.

A frame is a 4-byte big-endian length and that many bytes of body:

- a CNI call (the ``sluice`` executable forwarding a runtime's call): ``C``,
  the protocol version and the length of the environment (u32 each), the
  environment as ``KEY=VALUE`` entries each ended by a NUL, then the stdin
  bytes as they came. Its answer: ``R``, the exit code (i32), the length of
  stdout (u32), stdout, then stderr. Binary, so that the executable, which
  runs once per call, needs neither json nor the socket module's Python
  layer: only the ``_socket`` and ``_struct`` built-ins;
- anything else (sluicectl's ``status``, ``apply``, ``delete``, ``get``,
  ``explain``): a UTF-8 JSON object with ``v`` and ``op``, answered by one.

Each side bounds a whole exchange, not each ``recv``: ``Deadline`` wraps a
socket so that every operation gets only what is left of one budget, and a
peer that trickles a byte at a time cannot stretch it.

Standard library only; the CNI part only built-in modules.
"""

import _struct
import time

from cni.plugin import release

VERSION = 1
MAX_REQUEST = 1 << 20  # 1 MiB: a CNI config with a large prevResult fits easily
MAX_ANSWER = 64 << 20  # listings of many endpoints and policies
LENGTH = _struct.Struct(">I")
CALL_HEAD = _struct.Struct(">cII")  # b"C", version, environment length
ANSWER_HEAD = _struct.Struct(">ciI")  # b"R", exit code, stdout length

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Protocol

    class Socket(Protocol):
        def sendall(self, data: bytes) -> None: ...

        def recv(self, size: int) -> bytes: ...


class FrameError(Exception):
    """The peer broke the protocol (size, framing, JSON, fields)."""


class DeadlineExceeded(OSError):
    """The exchange's time budget ran out (a slow or stuck peer)."""


class Deadline:
    """A socket whose operations share one budget of ``seconds`` from now."""

    def __init__(self, sock: "Any", seconds: float) -> None:
        self.sock = sock
        self.seconds = seconds
        self.ends = time.monotonic() + seconds

    def left(self) -> float:
        left = self.ends - time.monotonic()
        if left <= 0:
            raise self.expired()
        self.sock.settimeout(left)
        return left

    def expired(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"the exchange's deadline of {self.seconds:g} s passed")

    def connect(self, address: str) -> None:
        self.left()
        try:
            self.sock.connect(address)
        except TimeoutError:
            raise self.expired() from None

    def sendall(self, data: bytes) -> None:
        self.left()  # sendall's timeout bounds the whole send, not each chunk
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise self.expired() from None

    def recv(self, size: int) -> bytes:
        self.left()
        try:
            return self.sock.recv(size)
        except TimeoutError:
            raise self.expired() from None


def send_frame(sock: "Socket", body: bytes) -> None:
    sock.sendall(LENGTH.pack(len(body)) + body)


def receive_frame(sock: "Socket", limit: int) -> bytes:
    (length,) = LENGTH.unpack(_exactly(sock, LENGTH.size))
    if length > limit:
        raise FrameError(f"message of {length} bytes is over the limit of {limit}")
    return _exactly(sock, length)


def _exactly(sock: "Socket", count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(min(count, 1 << 16))
        if not chunk:
            raise FrameError("connection closed mid-message")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


# -- CNI calls ---------------------------------------------------------------------------


def call_frame(
    env: "Mapping[str, str] | Mapping[bytes, bytes]",
    stdin: bytes,
    caller_release: str = release.VERSION,
) -> bytes:
    """The frame of a CNI call. ``env`` may be the process's own environment as bytes
    (``posix.environ``): the executable sends it without decoding it. The sender's
    release goes last (the last of a repeated key wins), so the agent can refuse a
    launcher of another release."""
    entries = b"".join(_env_entry(key, value) for key, value in env.items())
    entries += f"{release.CALLER_KEY}={caller_release}".encode() + b"\0"
    return CALL_HEAD.pack(b"C", VERSION, len(entries)) + entries + stdin


def _env_entry(key: "str | bytes", value: "str | bytes") -> bytes:
    if isinstance(key, bytes) and isinstance(value, bytes):
        return key + b"=" + value + b"\0"
    if isinstance(key, str) and isinstance(value, str):
        return f"{key}={value}".encode() + b"\0"
    raise TypeError(f"environment entry {key!r}={value!r} mixes bytes and str")


def is_call(body: bytes) -> bool:
    return body[:1] == b"C"


def parse_call(body: bytes) -> tuple[dict[str, str], bytes]:
    """(environment, stdin) of a CNI call frame."""
    if len(body) < CALL_HEAD.size:
        raise FrameError("CNI call frame too short")
    _, version, env_length = CALL_HEAD.unpack_from(body)
    if version != VERSION:
        raise FrameError(f"unsupported protocol version {version}")
    start = CALL_HEAD.size
    if start + env_length > len(body):
        raise FrameError(f"environment of {env_length} bytes overruns the frame")
    entries = body[start : start + env_length]
    if entries and not entries.endswith(b"\0"):
        raise FrameError("environment does not end with a NUL")
    env: dict[str, str] = {}
    for entry in entries.split(b"\0")[:-1]:
        key, sep, value = entry.decode(errors="surrogateescape").partition("=")
        if not sep or not key:
            raise FrameError(f"environment entry {entry[:40]!r} is not KEY=VALUE")
        env[key] = value
    return env, body[start + env_length :]


def answer_frame(rc: int, stdout: str, stderr: str) -> bytes:
    out = stdout.encode()
    return ANSWER_HEAD.pack(b"R", rc, len(out)) + out + stderr.encode()


def parse_answer(body: bytes) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a CNI answer frame."""
    if body[:1] != b"R" or len(body) < ANSWER_HEAD.size:
        raise FrameError("not a CNI answer")
    _, rc, out_length = ANSWER_HEAD.unpack_from(body)
    out_end = ANSWER_HEAD.size + out_length
    return rc, body[ANSWER_HEAD.size : out_end].decode(), body[out_end:].decode()


# -- sluicectl's requests ----------------------------------------------------------------


def send(sock: "Socket", message: "dict[str, Any]") -> None:
    import json

    send_frame(sock, json.dumps(message, separators=(",", ":")).encode())


def receive(sock: "Socket", limit: int) -> "dict[str, Any]":
    return decode(receive_frame(sock, limit))


def decode(body: bytes) -> "dict[str, Any]":
    import json

    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise FrameError(f"message is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise FrameError("message is not a JSON object")
    return message
