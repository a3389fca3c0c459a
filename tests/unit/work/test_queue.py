"""The work queue and its worker: each key once while it waits, never two passes of
one key at once, a change during a pass processed after it, failures back with
growing delays, the earliest of delayed adds, a prompt stop."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cni.work.queue import Worker, WorkQueue

log = logging.getLogger("test")


def test_a_waiting_key_is_queued_once_in_order() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    taken = [queue.get(timeout=0) for _ in range(3)]
    assert taken == ["a", "b", "c"]
    assert queue.get(timeout=0.01) is None


def test_a_key_added_during_its_pass_comes_back_after_it_not_beside_it() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("routes")
    assert queue.get(timeout=0) == "routes"
    queue.add("routes")  # a change while the pass runs
    queue.add("routes")
    assert queue.get(timeout=0.01) is None, "never handed out twice at once"
    queue.done("routes")
    assert queue.get(timeout=0) == "routes", "the change is processed after the pass"
    queue.done("routes")
    assert queue.get(timeout=0.01) is None, "once"


def test_delayed_keys_come_due_in_order_and_the_earliest_add_holds() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("late", 0.2)
    queue.add_after("soon", 0.05)
    queue.add_after("soon", 5.0)  # a later resync does not postpone it
    started = time.monotonic()
    assert queue.get(timeout=2) == "soon"
    assert 0.04 <= time.monotonic() - started < 1.0
    assert queue.get(timeout=2) == "late"
    assert queue.get(timeout=0.3) is None, "the replaced add_after of soon is gone"


def test_failures_wait_longer_each_time_until_forgotten() -> None:
    queue: WorkQueue[str] = WorkQueue(base=0.8, cap=30.0)
    delays = [queue.add_rate_limited("x") for _ in range(5)]
    ceilings = [min(30.0, 0.8 * 2**n) for n in range(5)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert queue.failures("x") == 5
    queue.forget("x")
    assert queue.failures("x") == 0
    assert queue.add_rate_limited("x") <= 0.8


def test_shut_down_wakes_a_waiting_get_and_refuses_new_keys() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    getter = threading.Thread(target=lambda: got.append(queue.get()))
    getter.start()
    time.sleep(0.05)
    queue.shut_down()
    getter.join(timeout=2)
    assert not getter.is_alive() and got == [None]
    queue.add("x")
    assert len(queue) == 0


def test_the_worker_retries_a_failing_key_and_resyncs_a_succeeding_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue: WorkQueue[str] = WorkQueue(base=0.02, cap=0.05)
    calls: list[tuple[str, float]] = []
    done = threading.Event()

    def process(key: str) -> float | None:
        calls.append((key, time.monotonic()))
        if key == "flaky" and sum(1 for k, _ in calls if k == "flaky") < 3:
            raise OSError("map write refused")
        if key == "resync" and sum(1 for k, _ in calls if k == "resync") >= 3:
            done.set()
            return None
        return 0.02 if key == "resync" else None

    worker = Worker("test-worker", queue, process, log, expected=(OSError,))
    worker.start()
    try:
        queue.add("flaky")
        queue.add("resync")
        assert done.wait(5)
        time.sleep(0.2)
    finally:
        worker.stop()
    assert not worker.alive
    assert [k for k, _ in calls].count("flaky") == 3, "failed twice, then succeeded"
    assert [k for k, _ in calls].count("resync") == 3, "resynced until it said no more"
    assert queue.failures("flaky") == 0, "forgotten after its success"
    warnings = [r for r in caplog.records if "map write refused" in r.getMessage()]
    assert len(warnings) == 2 and all(r.exc_info is None for r in warnings)


def test_an_unexpected_exception_is_logged_with_its_traceback_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue: WorkQueue[str] = WorkQueue(base=0.02, cap=0.05)
    seen: list[str] = []

    def process(key: str) -> None:
        seen.append(key)
        if key == "bug":
            raise KeyError("a bug")

    worker = Worker("test-worker", queue, process, log)
    worker.start()
    try:
        queue.add("bug")
        queue.add("fine")
        deadline = time.monotonic() + 5
        while "fine" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
    assert "fine" in seen
    assert any(r.exc_info for r in caplog.records if "processing 'bug' failed" in r.getMessage())


def test_spacing_gathers_the_changes_of_an_interval_into_one_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    passes: list[float] = []
    worker = Worker("test-worker", queue, lambda key: passes.append(time.monotonic()), log,
                    spacing=0.2)  # fmt: skip
    worker.start()
    try:
        queue.add("flush")
        time.sleep(0.05)
        for _ in range(20):  # changes during the spacing
            queue.add("flush")
            time.sleep(0.005)
        time.sleep(0.4)
    finally:
        worker.stop()
    assert len(passes) == 2, passes
    assert passes[1] - passes[0] >= 0.2


def test_stop_returns_promptly_while_a_key_is_delayed_far_ahead() -> None:
    queue: WorkQueue[str] = WorkQueue()
    worker = Worker("test-worker", queue, lambda key: 3600.0, log)
    worker.start()
    queue.add("hourly")
    time.sleep(0.05)
    started = time.monotonic()
    worker.stop()
    assert not worker.alive and time.monotonic() - started < 1.0
