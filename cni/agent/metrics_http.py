"""The agent's HTTP server (``--metrics-address``): ``/metrics``, ``/healthz``,
``/readyz``.

Its threads are bounded: a fixed pool of ``WORKERS`` serves the connections,
``BACKLOG`` more may wait, and any beyond are closed at once; answers are
paced (at least ``MIN_GAP`` apart, waited for without holding the
interpreter), so that scrapers, however many and however fast, cost the CNI
path a bounded number of threads and a bounded share of the interpreter.
Each read of a connection must come within ``TIMEOUT`` seconds.

- ``/metrics``: Prometheus' text format, rendered at most once per
  ``RENDER_INTERVAL`` seconds and by one thread at a time: scrapers in between
  get the last rendering, so that however often they come, reading the
  datapath costs the agent the same;
- ``/healthz``: 200 while the agent's process serves (a liveness probe);
- ``/readyz``: 200 once every watched kind has synced and the agent computes
  and enforces policy, 503 with what it still waits for before that (a
  readiness probe: a DaemonSet's pod is Ready only then).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("sluice.agent")

WORKERS = 2  # connections served at once
BACKLOG = 16  # connections waiting for a worker; more are closed
TIMEOUT = 10.0  # seconds per read of a connection
RENDER_INTERVAL = 1.0  # seconds one rendering of /metrics serves every scraper
MIN_GAP = 0.05  # seconds between two answers: at most 20 a second, however many ask

# (ready?, why not): the agent's readiness.
Readiness = Callable[[], tuple[bool, str]]


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = TIMEOUT
    protocol_version = "HTTP/1.0"  # one request per connection: no worker held by keep-alive

    def do_GET(self) -> None:
        self.server.pace()
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, self.server.rendered(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._answer(200, b"ok\n")
        elif path == "/readyz":
            ready, why = self.server.readiness()
            self._answer(200 if ready else 503, (b"ok" if ready else why.encode()) + b"\n")
        else:
            self._answer(404, b"not found: /metrics, /healthz, /readyz\n")

    def _answer(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics http: " + format, *args)


class MetricsServer(HTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, readiness: Readiness
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="metrics")
        self._queued = threading.BoundedSemaphore(WORKERS + BACKLOG)
        self._render_lock = threading.Lock()
        self._pace_lock = threading.Lock()
        self._last_answer = 0.0
        self._rendering: tuple[float, bytes] | None = None  # (when, what)
        super().__init__(address, _Handler)

    def pace(self) -> None:
        """Wait until MIN_GAP has passed since the last answer began."""
        with self._pace_lock:
            wait = self._last_answer + MIN_GAP - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._last_answer = time.monotonic()

    def rendered(self) -> bytes:
        """The metrics, rendered now if the last rendering is older than RENDER_INTERVAL."""
        with self._render_lock:
            if self._rendering is None or time.monotonic() - self._rendering[0] > RENDER_INTERVAL:
                self._rendering = (time.monotonic(), generate_latest(self.registry))
            return self._rendering[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._queued.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is closed
            return
        request.settimeout(TIMEOUT)
        self._pool.submit(self._serve, request, client_address)

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # one connection's trouble is its own
            log.debug("metrics http: a connection failed", exc_info=True)
        finally:
            self.shutdown_request(request)
            self._queued.release()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def serve(address: str, registry: CollectorRegistry, readiness: Readiness) -> MetricsServer:
    """Serve on ``HOST:PORT`` (an empty HOST is 127.0.0.1) in a thread of its own."""
    host, _, port = address.rpartition(":")
    server = MetricsServer((host or "127.0.0.1", int(port)), registry, readiness)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
