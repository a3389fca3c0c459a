"""The Kubernetes API as the agent and the controller use it: lists and watches of
raw JSON (no typed models, so nothing is built that would be thrown away at
once), and the few writes the controller makes.

Connection settings (server, TLS, credentials) come from a kubeconfig file, or the
pod's service account when run in a cluster (``kubeconfig``).
"""

from __future__ import annotations

import builtins
import json
import logging
import random
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from cni.kube import kubeconfig as connection
from cni.kube.kubeconfig import ConfigError
from cni.kube.liststream import ListFormatError, list_members

log = logging.getLogger("sluice.k8s")

# A hung server (or a network that drops everything) must fail a request well
# before any lease or deadline of the callers runs out: connecting, and each
# read of an answer, have their own timeouts.
CONNECT_SECONDS = 5.0
READ_SECONDS = 30.0  # between two reads of an answer (a large list streams steadily)
# The server ends a watch after timeoutSeconds (it is resumed where it stopped),
# a random time in [WATCH_SECONDS, WATCH_SECONDS * 1.5) so that clients started
# together do not come back together. A watch on which nothing arrives for
# WATCH_IDLE_SECONDS is ended by the client as if the server had ended it (a
# quiet collection gets no BOOKMARKs from a server without etcd progress
# notifications: measured on the test cluster, none in 140 s), so a connection to
# a server that hung is given up; the next watch's request then fails.
WATCH_SECONDS = 300
WATCH_IDLE_SECONDS = 90.0
BATCH = 100  # objects of a list handed on at a time (each decoded as it arrives)
INFLATE_CHUNK = 1 << 18  # decompressed bytes decoded at a time
CONTINUE_EXCLUDES = ("resourceVersion", "resourceVersionMatch")


class ApiError(Exception):
    """The API server refused a request or could not be reached."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


class Gone(ApiError):
    """410: the resourceVersion to resume from is too old; list again."""


@dataclass(frozen=True)
class Listed:
    items: list[dict[str, Any]]
    resource_version: str


Timeout = float | None  # seconds for connecting and for each read; None: the defaults


class Api:
    def __init__(
        self,
        kubeconfig: str | None = None,
        *,
        connect_seconds: float = CONNECT_SECONDS,
        read_seconds: float = READ_SECONDS,
        watch_idle_seconds: float = WATCH_IDLE_SECONDS,
    ) -> None:
        conn = connection.load(kubeconfig)
        self.client = httpx.Client(
            base_url=conn.server,
            verify=conn.verify,
            auth=conn.auth,
            timeout=httpx.Timeout(read_seconds, connect=connect_seconds),
        )
        self.connect_seconds = connect_seconds
        self.watch_idle_seconds = watch_idle_seconds
        # What the server sent: JSON bytes (decoded) and bytes on the wire (compressed,
        # when the server compresses a large list). For the scale figures.
        self.received_bytes = 0
        self.wire_bytes = 0
        self._counting = threading.Lock()

    def _count(self, received: int, wire: int) -> None:
        with self._counting:
            self.received_bytes += received
            self.wire_bytes += wire

    def close(self) -> None:
        self.client.close()

    # -- reading -------------------------------------------------------------------------

    def list(self, path: str, **params: str) -> Listed:
        """Every object of a collection, paged (``limit``/``continue``)."""
        items: list[dict[str, Any]] = []
        version = ""
        for page, page_version in self.pages(path, **params):
            items.extend(page)
            version = page_version
        return Listed(items, version)

    # ``list`` names the method above in this class body: the builtin by its full name.
    def pages(
        self, path: str, **params: str
    ) -> Iterator[tuple[builtins.list[dict[str, Any]], str]]:
        """A collection in batches of at most ``BATCH`` objects as they arrive, each with
        the list's resourceVersion (final with the last batch), so that a caller trims
        each batch before the next is decoded instead of holding the whole collection
        as JSON. Server pages (``limit``/``continue``) are followed; the watch cache
        answers ``resourceVersion=0`` in one piece however long, so each response is
        decoded an item at a time (``liststream``)."""
        query = {"limit": "500", **params}
        while True:
            version, token = "", ""
            batch: list[dict[str, Any]] = []
            for member, value in self._list_stream(path, query):
                if member == "item":
                    batch.append(value)
                    if len(batch) >= BATCH:
                        yield batch, version
                        batch = []
                elif member == "metadata" and isinstance(value, dict):
                    version = str(value.get("resourceVersion", ""))
                    token = str(value.get("continue") or "")
            yield batch, version
            if not token:
                return
            # The token carries the list's resourceVersion; the server refuses both with it.
            query = {k: v for k, v in query.items() if k not in CONTINUE_EXCLUDES}
            query["continue"] = token

    def _list_stream(self, path: str, query: dict[str, str]) -> Iterator[tuple[str, Any]]:
        # The body is read off the network whole, compressed (the server gzips a large
        # list: 25 MB of pods are about 1.2 MB), and decompressed and decoded a piece at
        # a time afterwards. Reading at the pace of decoding instead stalls the server's
        # writes while this process's threads take their turns, and the server ends a
        # request that takes longer than its timeout (60 s) half-written.
        try:
            with self.client.stream(
                "GET", path, params=query, headers={"Accept-Encoding": "gzip"}
            ) as response:
                if response.status_code >= 300:
                    response.read()
                    raise _error(response)
                raw = list(response.iter_raw())
                encoding = response.headers.get("content-encoding", "identity").lower()
        except httpx.HTTPError as err:
            raise ApiError(0, f"GET {path} failed: {err}") from None
        except ConfigError as err:
            raise ApiError(0, f"GET {path}: no credentials: {err}") from None
        if encoding not in ("identity", "gzip"):
            raise ApiError(0, f"GET {path}: unexpected content-encoding {encoding!r}")
        self._count(0, sum(map(len, raw)))

        def chunks() -> Iterator[bytes]:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
            while raw:
                data = raw.pop(0)
                if inflate is None:
                    self._count(len(data), 0)
                    yield data
                    continue
                while data:
                    out = inflate.decompress(data, INFLATE_CHUNK)
                    data = inflate.unconsumed_tail
                    self._count(len(out), 0)
                    yield out
            if inflate is not None:
                yield inflate.flush()

        try:
            yield from list_members(chunks())
        except (ListFormatError, zlib.error) as err:
            raise ApiError(0, f"GET {path}: not a list: {err}") from None

    def watch(
        self, path: str, resource_version: str, **params: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) events after ``resource_version``, until the server ends the
        watch, or nothing has arrived for ``watch_idle_seconds``. BOOKMARK events
        carry only a newer resourceVersion. Raises Gone; raises ApiError when the
        server does not answer within ``watch_idle_seconds`` or keeps the watch open
        well past the timeoutSeconds it was asked for."""
        seconds = round(WATCH_SECONDS * (1 + random.random() / 2))
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
            **params,
        }
        deadline = time.monotonic() + seconds + self.watch_idle_seconds
        timeout = httpx.Timeout(self.watch_idle_seconds, connect=self.connect_seconds)
        try:
            with self.client.stream("GET", path, params=query, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise _error(response)
                try:
                    yield from self._events(path, response, deadline, seconds)
                except httpx.ReadTimeout:
                    log.debug(
                        "watch of %s: quiet for %g s, ending it", path, self.watch_idle_seconds
                    )
        except httpx.HTTPError as err:
            raise ApiError(0, f"watch of {path} failed: {err}") from None
        except ConfigError as err:
            raise ApiError(0, f"watch of {path}: no credentials: {err}") from None

    def _events(
        self, path: str, response: httpx.Response, deadline: float, seconds: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        downloaded = 0
        for line in response.iter_lines():
            wire = response.num_bytes_downloaded
            self._count(len(line) + 1, wire - downloaded)
            downloaded = wire
            if time.monotonic() > deadline:
                raise ApiError(0, f"watch of {path} still open {seconds} s after its end")
            if not line:
                continue
            event = _json_object(line, f"watch of {path}")
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                status = int(obj.get("code") or 0)
                message = str(obj.get("message", "watch error"))
                raise Gone(status, message) if status == 410 else ApiError(status, message)
            yield str(kind), obj

    def get(self, path: str, *, timeout: Timeout = None) -> dict[str, Any] | None:
        """One object, or None when it does not exist."""
        try:
            return self._json("GET", path, timeout=timeout)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    # -- writing -------------------------------------------------------------------------
    # ``timeout`` bounds connecting and each read of the answer: a caller that may
    # act only until a moment (a leader, until its lease runs out) gives up by then.

    def create(self, path: str, obj: dict[str, Any], *, timeout: Timeout = None) -> dict[str, Any]:
        return self._json("POST", path, json=obj, timeout=timeout)

    def replace(self, path: str, obj: dict[str, Any], *, timeout: Timeout = None) -> dict[str, Any]:
        """PUT; ApiError 409 when the object changed since it was read."""
        return self._json("PUT", path, json=obj, timeout=timeout)

    def patch(self, path: str, patch: dict[str, Any], *, timeout: Timeout = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): keys with null values are removed."""
        return self._json(
            "PATCH",
            path,
            content=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
            timeout=timeout,
        )

    def delete(self, path: str, *, timeout: Timeout = None) -> None:
        try:
            self._json("DELETE", path, timeout=timeout)
        except ApiError as err:
            if err.status != 404:
                raise

    def _json(
        self, method: str, path: str, *, timeout: Timeout = None, **kwargs: Any
    ) -> dict[str, Any]:
        limit: Any = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout)
        try:
            response = self.client.request(method, path, timeout=limit, **kwargs)
        except httpx.HTTPError as err:
            raise ApiError(0, f"{method} {path} failed: {err}") from None
        except ConfigError as err:
            raise ApiError(0, f"{method} {path}: no credentials: {err}") from None
        self._count(len(response.content), response.num_bytes_downloaded)
        if response.status_code >= 300:
            raise _error(response)
        return _json_object(response.content, f"{method} {path}") if response.content else {}


def _json_object(data: bytes | str, what: str) -> dict[str, Any]:
    """A JSON object from the server; ApiError when the body is anything else."""
    try:
        value = json.loads(data)
    except ValueError as err:
        raise ApiError(0, f"{what}: the answer is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ApiError(0, f"{what}: the answer is a {type(value).__name__}, not an object")
    return value


def _error(response: httpx.Response) -> ApiError:
    try:
        message = str(response.json().get("message", response.text))
    except (ValueError, AttributeError):  # not JSON, or JSON but not an object
        message = response.text
    cls = Gone if response.status_code == 410 else ApiError
    return cls(
        response.status_code, f"{response.request.method} {response.request.url.path}: {message}"
    )
