"""A Datapath handle owns its state lock and its reaper: nothing is kept per bpfDir
in the process beside the handles."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from cni.datapath import reaper
from cni.datapath.maps import Datapath


def flock_is_free(directory: Path) -> bool:
    """Whether another open file of the directory could take the lock now."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_state_lock_is_reentrant_and_released_with_the_outermost_hold(tmp_path: Path) -> None:
    datapath = Datapath(str(tmp_path))
    with datapath.lock:
        with datapath.lock:
            assert not flock_is_free(tmp_path)
        assert not flock_is_free(tmp_path), "still held by the outer block"
    assert flock_is_free(tmp_path)


def test_two_handles_of_one_directory_exclude_each_other(tmp_path: Path) -> None:
    first, second = Datapath(str(tmp_path)), Datapath(str(tmp_path))
    entered = threading.Event()

    def take_second() -> None:
        with second.lock:
            entered.set()

    with first.lock:
        thread = threading.Thread(target=take_second)
        thread.start()
        assert not entered.wait(0.2), "the second handle waits for the first's flock"
    thread.join(5)
    assert entered.is_set()


def test_the_lock_serialises_threads_of_one_handle(tmp_path: Path) -> None:
    datapath = Datapath(str(tmp_path))
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        for _ in range(50):
            with datapath.lock:
                with guard:
                    inside += 1
                    most = max(most, inside)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1


def test_a_reaper_belongs_to_its_handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reaper.Reaper, "_pass", lambda self, key: None)  # no maps: no passes
    mine, other = Datapath(str(tmp_path)), Datapath(str(tmp_path))
    thread = reaper.Reaper(mine)
    kicked: list[bool] = []
    thread.kick = lambda full=False: kicked.append(full)  # type: ignore[method-assign]
    thread.start()
    try:
        assert mine.reaper is thread and other.reaper is None
        with pytest.raises(RuntimeError, match="has a reaper already"):
            reaper.Reaper(mine).start()
        reaper.table_taken(mine)
        reaper.collect(mine)
        assert kicked == [False, True], "the handle's own reaper is kicked"
    finally:
        thread.stop()
    assert mine.reaper is None
