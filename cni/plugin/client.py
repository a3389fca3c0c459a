"""Talking to the agent: the plugin's forwarding and sluicectl's requests.

The forwarding path runs in the ``sluice`` executable on every call, so it
uses the ``_socket`` built-in directly: the ``socket`` module's Python layer
imports selectors, collections, enum and more, which would cost more than
the call itself.
"""

import _socket

from cni.plugin import frames

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# The whole of a forwarded call (connect, send, answer), by verb. DEL and GC must
# finish (a runtime retries a failed DEL forever, and the pod's address stays
# held): past their deadline the executable runs them itself, so that a listening
# but stuck agent costs a DEL this much and no more. ADD waits in the agent for its
# sources (up to 30 s, twice) and is never run twice at once: past its deadline an
# enforcing network's ADD and CHECK fail with code 11, and the runtime tries again.
CALL_DEADLINES = {b"DEL": 5.0, b"GC": 5.0}
CALL_DEADLINE = 90.0  # ADD, CHECK, STATUS
REQUEST_DEADLINE = 120.0  # sluicectl's requests, unless the caller gives one


class AgentUnavailable(Exception):
    """Nobody answers on the socket in time (no agent, a stuck one, or it died mid-call)."""


class RequestTooLarge(ValueError):
    """A request the agent would refuse for its size: never sent."""


def exchange(path: str, body: bytes, timeout: float | None = None) -> bytes:
    """Send one frame and return the answer's body, all within ``timeout`` seconds."""
    seconds = REQUEST_DEADLINE if timeout is None else timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    bounded = frames.Deadline(sock, seconds)
    try:
        try:
            bounded.connect(path)
        except OSError as err:
            raise AgentUnavailable(f'no agent on "{path}": {err.strerror or err}') from None
        try:
            frames.send_frame(bounded, body)
            return frames.receive_frame(bounded, frames.MAX_ANSWER)
        except (OSError, frames.FrameError) as err:
            raise AgentUnavailable(f'the agent on "{path}" did not answer: {err}') from None
    finally:
        sock.close()


def call_deadline(env: "Mapping[str, str] | Mapping[bytes, bytes]") -> float:
    """How long a forwarded call may take, by its CNI_COMMAND."""
    command = env.get(b"CNI_COMMAND") or env.get("CNI_COMMAND") or b""  # type: ignore[call-overload]
    if isinstance(command, str):
        command = command.encode()
    return CALL_DEADLINES.get(command, CALL_DEADLINE)


def forward(
    path: str,
    env: "Mapping[str, str] | Mapping[bytes, bytes]",
    stdin: bytes,
    timeout: float | None = None,
) -> tuple[int, str, str]:
    """Run one CNI call in the agent: (exit code, stdout, stderr)."""
    deadline = call_deadline(env) if timeout is None else timeout
    answer = exchange(path, frames.call_frame(env, stdin), deadline)
    try:
        return frames.parse_answer(answer)
    except frames.FrameError:
        refusal = answer[:200]
        raise AgentUnavailable(f'the agent on "{path}" refused the call: {refusal!r}') from None


def call(path: str, request: "dict[str, Any]", timeout: float | None = None) -> "dict[str, Any]":
    """One of sluicectl's requests (JSON) and its answer."""
    import json

    body = json.dumps(request, separators=(",", ":")).encode()
    if len(body) > frames.MAX_REQUEST:
        # The agent closes the socket on a frame over its limit: say so before sending.
        raise RequestTooLarge(
            f"the request is {len(body)} bytes, over the agent's limit of "
            f"{frames.MAX_REQUEST} bytes per request"
        )
    try:
        return frames.decode(exchange(path, body, timeout))
    except frames.FrameError as err:
        raise AgentUnavailable(f'the agent on "{path}" answered garbage: {err}') from None
