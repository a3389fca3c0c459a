"""One lock for the pinned state of a datapath: flock on its bpfDir.

Attach, detach, policy install, GC sweep and (re)load all take it, so no
writer ever sees another's half-done work. Each open ``Datapath`` owns one
(``datapath.lock``); it is re-entrant within its owner (a sweep inside a
detach, a switch inside a load) and serialises threads too; across processes,
and between two handles of one directory in a process, flock does (each
handle's lock opens the directory on its own, and flock locks of two open
files exclude each other). So a process holds one handle per directory and
never takes the lock of a second handle while holding the first's. Taking
it costs two system calls.

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


class StateLock:
    """``with lock:`` holds the flock on ``bpf_dir``, re-entrant within the process."""

    def __init__(self, bpf_dir: str) -> None:
        self.bpf_dir = bpf_dir
        self._threads = threading.RLock()
        self._fd = -1
        self._depth = 0

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            if self._depth == 0:
                os.makedirs(self.bpf_dir, exist_ok=True)
                fd = os.open(self.bpf_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the only descriptor of the open file releases the flock
        self._threads.release()
