"""One collection of the API kept in step: list, then watch from the list's
resourceVersion, resume a broken watch where it stopped, list again when the
server says that version is gone (410).

Every failure waits before the next request (``backoff``: exponential, capped,
jittered): a failed request, a 410, and a watch that ends at once without having
been useful (shorter than ``HEALTHY_WATCH_SECONDS``). The waits grow until a
watch stays open that long, so a server that refuses or drops every watch is
asked at most about twice per ``CAP_SECONDS / 2``, and the agents of a
cluster, cut off together, relist spread apart.

Objects are parsed (and so trimmed to what the resolver reads) as they
arrive, before anything keeps them. ``synced`` is set once the first list is
through; the sink sees every list as a whole replacement and every event on
its own.

Lists are read from the API server's watch cache, unless the informer is made
``consistent``: then every list (the first, and each after a 410) is a consistent
read from etcd, for a collection small enough that reading it whole from etcd
costs little and whose reader must see every object written before it started
(the prefix claims: a restarted agent adopts every claim it made).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cni.kube.api import Api, ApiError, Gone
from cni.policy.errors import PolicyInputError
from cni.work.backoff import HEALTHY_WATCH_SECONDS, Backoff

log = logging.getLogger("sluice.k8s")


class Sink(Protocol):
    def replace(self, kind: str, objects: list[Any]) -> None: ...

    def change(self, kind: str, event: str, obj: Any) -> None: ...


class Informer:
    def __init__(
        self,
        api: Api,
        kind: str,
        path: str,
        parse: Callable[[dict[str, Any]], Any],
        sink: Sink,
        params: dict[str, str] | None = None,
        *,
        consistent: bool = False,
    ) -> None:
        self.api = api
        self.kind = kind
        self.path = path
        self.parse = parse
        self.sink = sink
        self.params = params or {}
        self.consistent = consistent
        self.synced = threading.Event()
        self.resource_version = ""
        self.events = 0  # watch events seen (for the scale figures)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        backoff = Backoff()
        need_list = True
        while not self._stopping.is_set():
            watching_since: float | None = None
            ended = False  # the server ended the watch
            try:
                if need_list:
                    self._list()
                    need_list = False
                watching_since = time.monotonic()
                self._watch()
                ended = True
                problem = "the watch ended at once"
            except Gone:
                need_list = True
                problem = f"resourceVersion {self.resource_version} is gone, listing again"
            except Exception as err:
                if self._stopping.is_set():
                    return  # stopped while a request was open: its client may be closed
                if isinstance(err, ApiError):
                    problem = str(err)
                else:  # a bug: keep the informer alive, and say so
                    log.exception("%s: unexpected failure; listing again", self.kind)
                    problem = "unexpected failure"
                    need_list = True
            if self._stopping.is_set():
                return
            if watching_since is not None and (
                time.monotonic() - watching_since >= HEALTHY_WATCH_SECONDS
            ):
                backoff.reset()
                if ended:
                    continue  # the server ended a long watch: resume at once
            delay = backoff.next()
            log.warning("%s: %s; retrying in %.1f s", self.kind, problem, delay)
            self._stopping.wait(delay)

    def _list(self) -> None:
        started = time.monotonic()
        objects: list[Any] = []
        version = ""
        # From the API server's watch cache, not etcd: a list of every pod read from
        # etcd by each of a hundred agents at once is what overloads a control plane.
        # The first list takes the cache as it is ("0"); a list again never goes back
        # before what this informer has seen. A consistent informer names no
        # resourceVersion: the server then reads from etcd.
        at: dict[str, str]
        if self.consistent:
            at = {}
        elif self.resource_version:
            at = {"resourceVersion": self.resource_version, "resourceVersionMatch": "NotOlderThan"}
        else:
            at = {"resourceVersion": "0"}
        for page, page_version in self.api.pages(self.path, **self.params, **at):
            objects.extend(obj for obj in map(self._parse, page) if obj is not None)
            version = page_version  # the list's, once the last page is in
        self.sink.replace(self.kind, objects)
        self.resource_version = version
        self.synced.set()
        log.info(
            "%s: listed %d in %.2f s at resourceVersion %s",
            self.kind,
            len(objects),
            time.monotonic() - started,
            self.resource_version,
        )

    def _watch(self) -> None:
        for event, raw in self.api.watch(self.path, self.resource_version, **self.params):
            if self._stopping.is_set():
                return
            version = (raw.get("metadata") or {}).get("resourceVersion")
            if event != "BOOKMARK":
                obj = self._parse(raw)
                if obj is not None:
                    self.events += 1
                    self.sink.change(self.kind, event, obj)
            if version:
                self.resource_version = str(version)

    def _parse(self, raw: dict[str, Any]) -> Any:
        try:
            return self.parse(raw)
        except PolicyInputError as err:
            # The API server validated it: this is something the resolver cannot read.
            log.error("%s: ignoring an object the resolver cannot read: %s", self.kind, err)
            return None
