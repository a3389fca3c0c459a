"""Proxies between a client and the test cluster's API server, to make it fail as a
real network or server does.

* ``TcpProxy`` passes bytes both ways (TLS stays end to end) until ``hang()``: from
  then on it forwards nothing, in either direction, on open connections and new
  ones, and closes nothing: a server that is there and does not answer.
* ``WatchRefusingProxy`` speaks HTTP to the client (plain, on 127.0.0.1) and HTTPS
  to the server: it answers every watch itself (``410 Gone``, or an empty watch
  that ends at once) and forwards everything else; it records every request.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml


def proxied_kubeconfig(
    kubeconfig: Path, path: Path, server: str, user: dict[str, Any] | None = None
) -> Path:
    """A copy of ``kubeconfig`` that reaches the API at ``server``, as ``user``."""
    conf = yaml.safe_load(kubeconfig.read_text())
    for cluster in conf["clusters"]:
        cluster["cluster"]["server"] = server
    if user is not None:
        for entry in conf["users"]:
            entry["user"] = user
    path.write_text(yaml.safe_dump(conf))
    path.chmod(0o600)
    return path


def kubeconfig_token(kubeconfig: Path) -> str:
    conf = yaml.safe_load(kubeconfig.read_text())
    return str(conf["users"][0]["user"]["token"])


def kubeconfig_server(kubeconfig: Path) -> tuple[str, int]:
    conf = yaml.safe_load(kubeconfig.read_text())
    server = urllib.parse.urlsplit(conf["clusters"][0]["cluster"]["server"])
    return str(server.hostname), int(server.port or 443)


class TcpProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.hung = threading.Event()
        self.closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def hang(self) -> None:
        self.hung.set()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self.hung.is_set():
                continue  # accepted, never answered
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.append(server)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.2)
        while not self.closed.is_set():
            if self.hung.is_set():
                time.sleep(0.2)  # hold the connection; read and forward nothing
                continue
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                sink.close()
                return
            if self.hung.is_set():
                continue  # what arrived once hung goes nowhere
            try:
                sink.sendall(data)
            except OSError:
                return


@dataclass(frozen=True)
class Seen:
    at: float  # time.monotonic()
    method: str
    path: str
    watch: bool


class WatchRefusingProxy:
    """``mode`` is "gone" (every watch is answered 410) or "ends" (every watch is
    answered with an empty stream that ends at once)."""

    def __init__(self, upstream: str, verify: ssl.SSLContext, mode: str) -> None:
        if mode not in ("gone", "ends"):
            raise ValueError(f"mode {mode!r}")
        self.mode = mode
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(base_url=upstream, verify=verify, timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="watch-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._client.close()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        watch = query.get("watch", [""])[0] in ("1", "true")
        with self._lock:
            self.seen.append(Seen(time.monotonic(), handler.command, url.path, watch))
        if watch and self.mode == "gone":
            status = {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": "too old resource version",
            }  # fmt: skip
            self._answer(handler, 410, json.dumps(status).encode())
            return
        if watch:
            self._answer(handler, 200, b"")
            return
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {
            k: v for k, v in handler.headers.items()
            if k.lower() in ("authorization", "content-type", "accept")
        }  # fmt: skip
        sent = self._client.request(handler.command, handler.path, content=body, headers=headers)
        self._answer(handler, sent.status_code, sent.content)

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)
