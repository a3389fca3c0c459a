"""One lock for the pinned state of a datapath: flock on its bpfDir.

Attach, detach, policy install, GC sweep and (re)load all take it, so no
writer ever sees another's half-done work. It is re-entrant within a
process (a sweep inside a detach, a switch inside a load) and serialises
threads too; across processes flock does. Taking it costs two system calls.
Inserting and dropping an endpoint's conntrack table happen outside it: each
makes the kernel wait for an RCU grace period (about 10 ms), and the table
is keyed by the endpoint alone (a sweep keeps the table of a live endpoint).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_guard = threading.Lock()
_locks: dict[str, threading.RLock] = {}
_held: dict[str, list[int]] = {}  # bpf_dir -> [fd, depth]


@contextmanager
def state_lock(bpf_dir: str) -> Iterator[None]:
    with _guard:
        lock = _locks.setdefault(bpf_dir, threading.RLock())
    with lock:
        held = _held.get(bpf_dir)
        if held is None:
            os.makedirs(bpf_dir, exist_ok=True)
            fd = os.open(bpf_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            held = _held[bpf_dir] = [fd, 0]
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
            if held[1] == 0:
                del _held[bpf_dir]
                os.close(held[0])
