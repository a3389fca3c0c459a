"""An HTTP listener whose clients, however slow or many, cost the agent a bounded
number of threads, file descriptors and seconds (``/metrics`` and the probes).

One thread accepts every connection, reads every request and writes every
answer without waiting on any client; a few workers compute answers, and only
for whole requests. So a client that trickles its request, or takes its answer
a byte at a time, holds a file descriptor, never a worker:

- each request has ``deadline`` seconds from its connect to the last byte of
  its answer: reading, waiting for a worker and writing together (a deadline
  per read would let a byte every few seconds hold a connection for ever);
- each source address has at most ``per_source`` connections open, the
  listener ``max_open``. A connection beyond either takes the place of the
  oldest one still sending its request (of that source, else of any), so a
  client that sends its request at once, as a probe does, is read however
  many connections trickle; when every open connection has sent its request,
  the new one is closed;
- a request's head is at most ``head_limit`` bytes; one request per connection;
- workers take whole requests in turn by source (one source's requests never
  push another's back) and begin answers at least ``min_gap`` apart, so that
  answering costs a bounded share of the interpreter whatever the clients do.
"""

from __future__ import annotations

import contextlib
import logging
import re
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from queue import SimpleQueue

from cni.agent.http_connections import Connection, TurnsBySource
from cni.agent.http_messages import Answer, Request, Route, encode

log = logging.getLogger("sluice.agent")

HEAD_END = re.compile(rb"\r?\n\r?\n")
ACCEPTS_PER_ROUND = 64  # connections accepted before the others are served again
DROPS_LOGGED_EVERY = 60.0  # seconds between two log lines counting what was closed
ACCEPT_PAUSE = 1.0  # seconds without accepting after an accept failed (no free descriptor)
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


@dataclass(frozen=True)
class Limits:
    deadline: float = 10.0  # seconds from connect to the answer's last byte
    per_source: int = 8  # connections open at once from one address
    max_open: int = 128  # connections open at once
    head_limit: int = 8192  # bytes of a request's head
    workers: int = 2  # answers computed at once
    min_gap: float = 0.05  # seconds between two answers: at most 20 a second


class ListenError(Exception):
    pass


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6; an empty HOST is 127.0.0.1)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f'"{address}" is not HOST:PORT with a port from 0 to 65535')
    return host.strip("[]") or "127.0.0.1", int(port)


class Listener:
    """Serves ``route``'s answers on ``address`` until ``close()``."""

    def __init__(self, name: str, address: str, route: Route, limits: Limits = Limits()) -> None:
        self.name = name
        self.route = route
        self.limits = limits
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listening = socket.create_server((host, port), family=family, backlog=128)
        except OSError as err:
            raise ListenError(f'{name}: cannot listen on "{address}": {err.strerror}') from None
        self._listening.setblocking(False)
        self.port = int(self._listening.getsockname()[1])
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listening, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._accepting_again = 0.0  # after a failed accept: when to try again (0: now)
        self._open: dict[socket.socket, Connection] = {}  # oldest first
        self._by_source: dict[str, int] = {}
        self._answered: SimpleQueue[Connection] = SimpleQueue()
        self._turns = TurnsBySource()
        self._pace_lock = threading.Lock()
        self._last_answer = 0.0
        self._dropped: dict[str, int] = {}  # why -> connections, since the last log line
        self._dropped_logged = -DROPS_LOGGED_EVERY  # the first drops are logged at once
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-io", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(limits.workers)
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stopping.set()
        self._wake()
        self._turns.stop()
        for thread in self._threads:
            thread.join(timeout=5)

    # -- the I/O thread --------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, events in self._selector.select(self._next_timeout()):
                    if key.fileobj is self._listening:
                        self._accept()
                    elif key.fileobj is self._wake_read:
                        self._take_answers()
                    elif key.data.closed:  # dropped earlier in this round
                        continue
                    elif events & selectors.EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
                self._expire()
                self._log_drops()
                if self._accepting_again and time.monotonic() >= self._accepting_again:
                    self._selector.register(self._listening, selectors.EVENT_READ)
                    self._accepting_again = 0.0
        except Exception:  # never expected; the probes then fail and say so
            log.exception("%s: the listener stopped", self.name)
        finally:
            for connection in list(self._open.values()):
                self._drop(connection, None)
            self._selector.close()
            self._listening.close()
            self._wake_read.close()
            self._wake_write.close()

    def _next_timeout(self) -> float:
        if not self._open:
            return 1.0
        soonest = min(connection.deadline for connection in self._open.values())
        return min(1.0, max(0.0, soonest - time.monotonic()))

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, peer = self._listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # e.g. out of file descriptors: try again in a while
                self._count_drop(f"accept failed: {err.strerror}")
                self._selector.unregister(self._listening)
                self._accepting_again = time.monotonic() + ACCEPT_PAUSE
                return
            sock.setblocking(False)
            connection = Connection(sock, peer[0], time.monotonic() + self.limits.deadline)
            if self._make_room(connection.source):
                self._open[sock] = connection
                self._by_source[connection.source] = self._by_source.get(connection.source, 0) + 1
                self._selector.register(sock, selectors.EVENT_READ, connection)
            else:
                self._count_drop("no room: every open connection has sent its request")
                sock.close()

    def _make_room(self, source: str) -> bool:
        """Room for one more connection from ``source``: the oldest connection still
        sending its request gives its place (of that source first)."""
        if self._by_source.get(source, 0) >= self.limits.per_source:
            victim = self._oldest_reading(source)
            if victim is None:
                return False
            self._drop(victim, f"more than {self.limits.per_source} from one address")
        if len(self._open) >= self.limits.max_open:
            victim = self._oldest_reading(None)
            if victim is None:
                return False
            self._drop(victim, f"more than {self.limits.max_open} open")
        return True

    def _oldest_reading(self, source: str | None) -> Connection | None:
        for connection in self._open.values():
            if connection.request is None and source in (None, connection.source):
                return connection
        return None

    def _read(self, connection: Connection) -> None:
        try:
            chunk = connection.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(connection, None)  # the client went away
            return
        searched = max(0, len(connection.received) - 3)  # an end may span two chunks
        connection.received += chunk
        end = HEAD_END.search(connection.received, searched)
        if end is not None and end.start() > self.limits.head_limit:
            end = None  # found, but too far
        if end is None and len(connection.received) <= self.limits.head_limit:
            return
        self._selector.unregister(connection.sock)  # read: from now on it waits or is written
        if end is None:
            self._refuse(connection, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            return
        request_line = bytes(connection.received[: end.start()]).split(b"\n", 1)[0]
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._refuse(connection, HTTPStatus.BAD_REQUEST)
            return
        method, target, _ = parts
        connection.request = Request(method, target.split("?", 1)[0], connection.source)
        if method != "GET":
            self._refuse(connection, HTTPStatus.METHOD_NOT_ALLOWED)
            return
        self._turns.put(connection)

    def _refuse(self, connection: Connection, status: HTTPStatus) -> None:
        """An answer that needs no worker, to a connection no longer read."""
        connection.request = connection.request or Request("", "", connection.source)
        answer = Answer(status, f"{status.phrase}\n".encode())
        connection.outgoing = memoryview(encode(answer))
        self._selector.register(connection.sock, selectors.EVENT_WRITE, connection)

    def _take_answers(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_read.recv(4096):
                pass
        while not self._answered.empty():
            connection = self._answered.get()
            if not connection.closed:
                self._selector.register(connection.sock, selectors.EVENT_WRITE, connection)

    def _write(self, connection: Connection) -> None:
        assert connection.outgoing is not None
        try:
            sent = connection.sock.send(connection.outgoing)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection, None)
            return
        connection.outgoing = connection.outgoing[sent:]
        if not connection.outgoing:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
            self._drop(connection, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for connection in [c for c in self._open.values() if c.deadline <= now]:
            if connection.request is None:
                why = "sent no whole request"
            elif connection.outgoing is None:
                why = "got no worker"
            else:
                why = "took no whole answer"
            self._drop(connection, f"{why} within {self.limits.deadline:g} s")

    def _drop(self, connection: Connection, why: str | None) -> None:
        """Close a connection; ``why`` counts it in the log (None: it was done)."""
        if connection.closed:
            return
        connection.closed = True
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        if why is not None:  # reset: no unsent answer is left for the kernel to trickle out
            with contextlib.suppress(OSError):
                connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        connection.sock.close()
        del self._open[connection.sock]
        left = self._by_source[connection.source] - 1
        if left:
            self._by_source[connection.source] = left
        else:
            del self._by_source[connection.source]
        if why is not None:
            self._count_drop(why)

    def _count_drop(self, why: str) -> None:
        self._dropped[why] = self._dropped.get(why, 0) + 1

    def _log_drops(self) -> None:
        """One warning a minute at most, when connections were closed unanswered."""
        if not self._dropped or time.monotonic() - self._dropped_logged < DROPS_LOGGED_EVERY:
            return
        counts = ", ".join(f"{count} ({why})" for why, count in sorted(self._dropped.items()))
        log.warning("%s: closed connections unanswered: %s", self.name, counts)
        self._dropped.clear()
        self._dropped_logged = time.monotonic()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_write.send(b"!")

    # -- the workers ---------------------------------------------------------------------

    def _work(self) -> None:
        while (connection := self._turns.take()) is not None:
            if connection.closed:  # its deadline passed while it waited
                continue
            self._pace()
            assert connection.request is not None
            try:
                answer = self.route(connection.request)
            except Exception:  # one request's trouble is its own
                log.exception("%s: answering %s failed", self.name, connection.request.path)
                answer = Answer(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
            # The I/O thread alone registers sockets; it takes the answer from here.
            connection.outgoing = memoryview(encode(answer))
            self._answered.put(connection)
            self._wake()

    def _pace(self) -> None:
        """Wait until min_gap has passed since the last answer began."""
        with self._pace_lock:
            wait = self._last_answer + self.limits.min_gap - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last_answer = time.monotonic()
