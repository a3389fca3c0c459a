"""The bounded HTTP listener of /metrics and the probes, on loopback: slow, many and
malformed clients cost it a bounded number of connections and seconds, and a
client that sends its request at once is answered whatever the others do.
(tests/node/agent/test_agent_slow_clients.py runs the same attack from a pod
against the agent.)"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cni.agent import metrics_http
from cni.agent.http_connections import Connection, TurnsBySource
from cni.agent.http_listener import Limits, Listener, ListenError, parse_address
from cni.agent.http_messages import Answer, Request

FAST = Limits(deadline=1.0, per_source=2, max_open=6, head_limit=256, workers=1, min_gap=0.0)
BIG = 4 * 1024 * 1024  # an answer larger than any socket buffer


def route(request: Request) -> Answer:
    if request.path == "/big":
        return Answer(200, b"x" * BIG)
    if request.path == "/boom":
        raise RuntimeError("boom")
    return Answer(200, f"{request.path} from {request.source}\n".encode())


@pytest.fixture
def listener() -> Iterator[Listener]:
    served = Listener("test http", "127.0.0.1:0", route, FAST)
    try:
        yield served
    finally:
        served.close()


def connect(listener: Listener, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", listener.port))
    sock.settimeout(5)
    return sock


def ask(listener: Listener, raw: bytes, source: str = "127.0.0.1") -> bytes:
    """Send ``raw`` at once; everything the listener answers before it closes."""
    with connect(listener, source) as sock:
        sock.sendall(raw)
        return receive_all(sock)


def receive_all(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def closed_by_listener(sock: socket.socket, within: float) -> float | None:
    """Seconds until the listener closed ``sock`` without answering; None if it stayed open."""
    started = time.monotonic()
    sock.settimeout(within)
    try:
        data = sock.recv(100)
    except TimeoutError:
        return None
    except ConnectionResetError:
        data = b""
    assert data == b"", f"answered, not closed: {data!r}"
    return time.monotonic() - started


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_answers_one_request_per_connection(listener: Listener) -> None:
    answer = ask(listener, b"GET /healthz?verbose HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.0 200 OK"
    assert b"Content-Length: 24" in head and b"Connection: close" in head
    assert body == b"/healthz from 127.0.0.1\n"
    assert status(ask(listener, b"GET /x HTTP/1.0\n\n")) == 200  # bare newlines too


def test_refuses_what_it_does_not_serve(listener: Listener) -> None:
    assert status(ask(listener, b"POST /healthz HTTP/1.1\r\n\r\n")) == 405
    assert status(ask(listener, b"hello\r\n\r\n")) == 400
    assert status(ask(listener, b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n")) == 431
    assert status(ask(listener, b"GET /boom HTTP/1.1\r\n\r\n")) == 500
    assert status(ask(listener, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200  # still serving


def test_a_request_has_one_deadline_however_it_trickles(listener: Listener) -> None:
    with connect(listener) as sock:
        stop = threading.Event()

        def trickle() -> None:
            for byte in b"GET /healthz HTTP/1.1\r\nX: " + b"y" * 100:
                if stop.wait(0.1):
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            closed_after = closed_by_listener(sock, within=3 * FAST.deadline)
        finally:
            stop.set()
            sender.join()
    assert closed_after is not None, "a byte every 0.1 s kept the connection open"
    assert closed_after < FAST.deadline + 0.5, closed_after


def test_one_source_holds_at_most_per_source_and_a_prompt_request_is_answered(
    listener: Listener,
) -> None:
    tricklers = [connect(listener, "127.0.0.2") for _ in range(5)]
    try:
        for sock in tricklers:
            with contextlib.suppress(ConnectionResetError):  # already made room for another
                sock.sendall(b"GET /healthz")  # and never the rest
        time.sleep(0.2)
        # The same source and another: each is read at once, in place of an older one.
        for source in ("127.0.0.2", "127.0.0.3"):
            answer = ask(listener, b"GET /probe HTTP/1.1\r\n\r\n", source)
            assert answer.endswith(f"/probe from {source}\n".encode())
        closed = [closed_by_listener(sock, within=0.3) for sock in tricklers]
        still_open = [sock for sock, after in zip(tricklers, closed, strict=True) if after is None]
        assert len(still_open) <= FAST.per_source, closed
        assert closed[0] is not None, "the oldest stayed open"
    finally:
        for sock in tricklers:
            sock.close()


def test_many_sources_hold_at_most_max_open(listener: Listener) -> None:
    tricklers = [connect(listener, f"127.0.1.{i}") for i in range(2 * FAST.max_open)]
    try:
        for sock in tricklers:
            with contextlib.suppress(ConnectionResetError):  # already made room for another
                sock.sendall(b"GET /")
        time.sleep(0.2)
        assert ask(listener, b"GET /probe HTTP/1.1\r\n\r\n").endswith(b"/probe from 127.0.0.1\n")
        open_ = [sock for sock in tricklers if closed_by_listener(sock, within=0.1) is None]
        assert len(open_) < FAST.max_open
    finally:
        for sock in tricklers:
            sock.close()


def test_a_client_that_takes_no_answer_holds_no_worker(listener: Listener) -> None:
    """FAST has one worker: it computes the big answer, then serves the next request
    while the listener waits for the first client to read."""
    with connect(listener, "127.0.0.2") as idle:
        idle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        idle.sendall(b"GET /big HTTP/1.1\r\n\r\n")
        time.sleep(0.2)
        started = time.monotonic()
        assert status(ask(listener, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200
        assert time.monotonic() - started < 0.5
        # Its deadline covers the answer too: the listener stops waiting and resets.
        time.sleep(FAST.deadline)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := idle.recv(65536):
                received += len(chunk)
        assert received < BIG


def test_whole_requests_are_taken_in_turn_by_source() -> None:
    turns = TurnsBySource()
    for source, name in (("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")):
        connection = Connection(socket.socket(), source, 0.0)
        connection.request = Request("GET", name, source)
        turns.put(connection)
    taken = []
    for _ in range(5):
        connection = turns.take()
        assert connection is not None and connection.request is not None
        taken.append(connection.request.path)
        connection.sock.close()
    assert taken == ["a1", "b1", "c1", "a2", "a3"]
    turns.stop()
    assert turns.take() is None


def test_close_stops_every_thread_and_frees_the_port() -> None:
    before = threading.active_count()
    served = Listener("test http", "127.0.0.1:0", route, FAST)
    port = served.port
    idle = connect(served)
    served.close()
    idle.close()
    assert threading.active_count() == before
    Listener("test http", f"127.0.0.1:{port}", route, FAST).close()


def test_addresses() -> None:
    assert parse_address(":9470") == ("127.0.0.1", 9470)
    assert parse_address("0.0.0.0:9470") == ("0.0.0.0", 9470)
    assert parse_address("[::1]:9470") == ("::1", 9470)
    for wrong in ("9470", "host:", "host:port", "host:70000"):
        with pytest.raises(ValueError, match=f'"{wrong}" is not HOST:PORT'):
            parse_address(wrong)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f'test http: cannot listen on "127.0.0.1:{port}"'):
            Listener("test http", f"127.0.0.1:{port}", route, FAST)


def test_the_probes_listener_serves_only_the_probes() -> None:
    served = metrics_http.serve_probes("127.0.0.1:0", lambda: (False, "not synced yet: pods"))
    try:
        assert ask(served, b"GET /healthz HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\nok\n")
        answer = ask(served, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert status(answer) == 503 and answer.endswith(b"not synced yet: pods\n")
        assert status(ask(served, b"GET /metrics HTTP/1.1\r\n\r\n")) == 404
    finally:
        served.close()
