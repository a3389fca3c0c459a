"""Network namespaces: open a CNI_NETNS path and enter it without forking.

pyroute2's ``IPRoute(netns=...)`` forks a helper for every socket. Instead the
calling thread enters the namespace with setns(2), opens its netlink socket
there and returns; the socket stays bound to the pod's namespace. setns only
moves the calling thread, so the switch back happens in ``finally``.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cni.spec.errors import ERR_INVALID_ENV, CNIError

CLONE_NEWNET = 0x40000000

_libc: ctypes.CDLL | None = None


class NetnsGone(Exception):
    """The namespace path does not exist (any more)."""


class NotANetns(Exception):
    """The path exists but is not a network namespace."""


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Netns:
    """An open network namespace; close it (or use ``with``) when done."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NetnsGone(path) from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_current(self) -> bool:
        """True when this is the caller's own namespace (e.g. a recycled /proc/PID path)."""
        mine = os.stat("/proc/thread-self/ns/net")
        theirs = os.fstat(self.fd)
        return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)

    @contextmanager
    def entered(self) -> Iterator[None]:
        """Run the body inside this namespace (this thread only)."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                _setns(self.fd)
            except OSError as err:
                if err.errno == errno.EINVAL:
                    raise NotANetns(self.path) from None
                raise
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)


def open_pod_netns(path: str) -> Netns:
    """Open CNI_NETNS for wiring: it must exist, be a network namespace, and not be
    the caller's own (a recycled /proc/PID path, say)."""
    try:
        netns = Netns(path)
    except NetnsGone:
        raise CNIError(ERR_INVALID_ENV, f'failed to open netns "{path}": no such file') from None
    except OSError as err:
        raise CNIError(ERR_INVALID_ENV, f'failed to open netns "{path}": {err.strerror}') from None
    try:
        if netns.is_current():
            raise CNIError(
                ERR_INVALID_ENV,
                f'CNI_NETNS "{path}" is the plugin\'s own network '
                "namespace; refusing to configure it",
            )
        with netns.entered():
            pass
    except NotANetns:
        netns.close()
        raise CNIError(ERR_INVALID_ENV, f'CNI_NETNS "{path}" is not a network namespace') from None
    except BaseException:
        netns.close()
        raise
    return netns
