"""Where an informer's lists are read: the watch cache by default, etcd when it is
consistent, the first list and the one after a 410 alike (the rest against a real
server: tests/node/controller/test_controller.py, tests/node/kube/test_api_faults.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cni.kube.api import Gone
from cni.kube.informer import Informer


class Api:
    """One object, listed at resourceVersion 7; the first watch answers 410, the
    second ends the test."""

    def __init__(self) -> None:
        self.lists: list[dict[str, str]] = []
        self.watches = 0
        self.done = threading.Event()

    def pages(self, path: str, **params: str) -> Iterator[tuple[list[dict[str, Any]], str]]:
        self.lists.append(params)
        yield [{"metadata": {"name": "a", "resourceVersion": "7"}}], "7"

    def watch(self, path: str, version: str, **params: str) -> Iterator[tuple[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            raise Gone(410, "too old")
        self.done.set()
        yield from ()


class Sink:
    def __init__(self) -> None:
        self.lists: list[list[Any]] = []

    def replace(self, kind: str, objects: list[Any]) -> None:
        self.lists.append(objects)

    def change(self, kind: str, event: str, obj: Any) -> None:
        raise AssertionError("no event expected")


def run(consistent: bool | None) -> tuple[Api, Sink]:
    api, sink = Api(), Sink()
    options = {} if consistent is None else {"consistent": consistent}
    informer = Informer(api, "things", "/things", lambda raw: raw, sink, **options)  # type: ignore[arg-type]
    informer.start()
    try:
        assert api.done.wait(10), "no second watch"
    finally:
        informer.stop()
    assert informer.synced.is_set() and len(sink.lists) == 2
    return api, sink


@pytest.mark.parametrize("consistent", [None, False])
def test_an_informer_lists_from_the_watch_cache(consistent: bool | None) -> None:
    api, _ = run(consistent)
    assert api.lists == [
        {"resourceVersion": "0"},
        {"resourceVersion": "7", "resourceVersionMatch": "NotOlderThan"},
    ]


def test_a_consistent_informer_lists_from_etcd_every_time() -> None:
    api, _ = run(consistent=True)
    assert api.lists == [{}, {}]
