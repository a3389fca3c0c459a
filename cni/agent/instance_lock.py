"""One agent per network: a lock held for the agent's whole life.

Two agents started at once for one network would both adopt its endpoints,
write its state and race for its socket (the later one would unlink the
other's and serve in its place). Each agent therefore takes, before it
touches anything, an exclusive ``flock`` on ``<stateDir>/agent/<network>.lock``
and on ``<agentSocket>.lock``; a second one finds them held and refuses to
start, naming the holder's pid. The kernel releases the locks when the
holder's process ends, however it ends, so a crashed agent never blocks the
next.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os


class AlreadyServed(Exception):
    """Another agent holds the lock."""


class InstanceLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, what: str) -> None:
        """Take the lock or raise AlreadyServed; ``what`` names what it guards."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyServed(
                f"another agent (pid {holder}) already serves {what} (lock {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
