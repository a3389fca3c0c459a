"""One lock for the pinned state of a datapath: flock on its bpfDir.

Attach, detach, policy install, GC sweep and (re)load all take it, so no
writer ever sees another's half-done work. It is re-entrant within a
process (a sweep inside a detach, a switch inside a load) and serialises
threads too; across processes flock does. Taking it costs two system calls.
Writes of a map of maps make the kernel wait for an RCU grace period (8 to
16 ms) and are kept out of it where they can be: an ADD that inserts its own
conntrack table does so outside it, and the reaper holds it only to take
stock and to mark what it did (``cni.datapath.reaper``). Installing new rule
sets is the exception: one batch per outer map, under the lock, so that no
reaper sees them before the endpoints that use them.
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
