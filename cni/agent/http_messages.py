"""What a client of the agent's HTTP listener sends and gets: a request as the
listener's routes see it, their answer, and the answer on the wire."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    source: str  # the client's address


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[Request], Answer]


def encode(answer: Answer) -> bytes:
    """HTTP/1.0, one answer per connection: no client keeps a connection for later."""
    phrase = HTTPStatus(answer.status).phrase
    head = (
        f"HTTP/1.0 {int(answer.status)} {phrase}\r\n"
        f"Content-Type: {answer.content_type}\r\n"
        f"Content-Length: {len(answer.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + answer.body
