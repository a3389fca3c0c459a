"""The agent's HTTP endpoints: ``/metrics`` with the probes (``--metrics-address``),
and the probes alone (``--health-address``).

- ``/metrics``: Prometheus' text format, rendered at most once per
  ``RENDER_INTERVAL`` seconds and by one thread at a time: scrapers in between
  get the last rendering, so that however often they come, reading the
  datapath costs the agent the same;
- ``/healthz``: 200 while the agent's process serves (a liveness probe);
- ``/readyz``: 200 once every watched kind has synced and the agent computes
  and enforces policy, 503 with what it still waits for before that (a
  readiness probe: a DaemonSet's pod is Ready only then).

Each address is a listener of its own (``http_listener``: bounded threads,
connections per source and seconds per request), so that the probes, served
apart, never wait behind a scraper or a client of the metrics port.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cni.agent.http_listener import Listener
from cni.agent.http_messages import Answer, Request

RENDER_INTERVAL = 1.0  # seconds one rendering of /metrics serves every scraper

# (ready?, why not): the agent's readiness.
Readiness = Callable[[], tuple[bool, str]]


class _Probes:
    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self.paths = "/healthz, /readyz"

    def __call__(self, request: Request) -> Answer:
        if request.path == "/healthz":
            return Answer(200, b"ok\n")
        if request.path == "/readyz":
            ready, why = self.readiness()
            return Answer(200 if ready else 503, (b"ok" if ready else why.encode()) + b"\n")
        return Answer(404, f"not found: {self.paths}\n".encode())


class _MetricsAndProbes(_Probes):
    def __init__(self, registry: CollectorRegistry, readiness: Readiness) -> None:
        super().__init__(readiness)
        self.paths = "/metrics, /healthz, /readyz"
        self.registry = registry
        self._render_lock = threading.Lock()
        self._rendering: tuple[float, bytes] | None = None  # (when, what)

    def __call__(self, request: Request) -> Answer:
        if request.path == "/metrics":
            return Answer(200, self.rendered(), CONTENT_TYPE_LATEST)
        return super().__call__(request)

    def rendered(self) -> bytes:
        """The metrics, rendered now if the last rendering is older than RENDER_INTERVAL."""
        with self._render_lock:
            if self._rendering is None or time.monotonic() - self._rendering[0] > RENDER_INTERVAL:
                self._rendering = (time.monotonic(), generate_latest(self.registry))
            return self._rendering[1]


def serve(address: str, registry: CollectorRegistry, readiness: Readiness) -> Listener:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``HOST:PORT`` (an empty HOST is
    127.0.0.1), in threads of their own."""
    return Listener("metrics http", address, _MetricsAndProbes(registry, readiness))


def serve_probes(address: str, readiness: Readiness) -> Listener:
    """``/healthz`` and ``/readyz`` alone on ``HOST:PORT``, in threads of their own."""
    return Listener("health http", address, _Probes(readiness))
