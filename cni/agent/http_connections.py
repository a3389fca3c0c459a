"""The HTTP listener's connections: what each has received and has yet to send,
and the whole requests waiting for a worker, handed out in turn by source."""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from cni.agent.http_messages import Request


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    source: str
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    request: Request | None = None  # set once the head is whole: no longer evictable
    outgoing: memoryview | None = None
    closed: bool = False


class TurnsBySource:
    """Whole requests waiting for a worker, handed out in turn by source."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, deque[Connection]] = OrderedDict()
        self._ready = threading.Condition()
        self._stopped = False

    def put(self, connection: Connection) -> None:
        with self._ready:
            self._waiting.setdefault(connection.source, deque()).append(connection)
            self._ready.notify()

    def take(self) -> Connection | None:
        """The next source's oldest request; None once stopped."""
        with self._ready:
            while not self._waiting and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return None
            source, waiting = next(iter(self._waiting.items()))
            connection = waiting.popleft()
            del self._waiting[source]
            if waiting:
                self._waiting[source] = waiting  # to the back of the line
            return connection

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
