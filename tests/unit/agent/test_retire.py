"""The retirer: releases at once, veth deletions at a quiet moment, and the waits of
an ADD, a repeated DEL and GC."""

from __future__ import annotations

import threading
import time

from cni.agent.retire import Retirer


def eventually(condition, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_the_release_runs_at_once_and_the_veth_waits_for_no_call_in_flight() -> None:
    retirer = Retirer(quiet=0.05, longest=30)
    done: list[str] = []
    try:
        with retirer.call():
            submit = retirer.defer(("c", "eth0"))
            submit(lambda: done.append("release"), lambda: done.append("veth"))
            assert eventually(lambda: done == ["release"])
            time.sleep(0.2)
            assert done == ["release"], "no veth is deleted while a call is in flight"
        assert eventually(lambda: done == ["release", "veth"])
    finally:
        retirer.close()


def test_a_veth_waits_no_longer_than_the_longest_wait() -> None:
    retirer = Retirer(quiet=0.05, longest=0.3)
    deleted = threading.Event()
    try:
        with retirer.call():
            retirer.defer(("c", "eth0"))(None, deleted.set)
            assert deleted.wait(3), "deleted although calls never stopped"
    finally:
        retirer.close()


def test_waiting_for_an_attachment_deletes_its_veth_now() -> None:
    retirer = Retirer(quiet=60, longest=60)
    done: list[str] = []
    try:
        with retirer.call():  # an ADD of attachment c, say: nothing is quiet
            submit = retirer.defer(("c", "eth0"))
            submit(lambda: done.append("release"), lambda: done.append("veth"))
            retirer.defer(("d", "eth0"))(None, lambda: done.append("other veth"))
            retirer.wait(("c", "eth0"))
            assert done == ["release", "veth"]
            retirer.drain()
        assert done == ["release", "veth", "other veth"]
    finally:
        retirer.close()


def test_a_failed_release_leaves_the_veth_and_closing_deletes_the_rest() -> None:
    retirer = Retirer(quiet=60, longest=60)
    done: list[str] = []

    def fails() -> None:
        raise RuntimeError("the IPAM store is gone")

    retirer.defer(("c", "eth0"))(fails, lambda: done.append("c veth"))
    retirer.defer(("d", "eth0"))(None, lambda: done.append("d veth"))
    retirer.close()
    assert done == ["d veth"]
    assert retirer.progress() == (2, False)
