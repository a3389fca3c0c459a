"""Netlink sockets for the node and for a pod, and error wrapping.

The sockets are ``Rtnl`` (cni/net/rtnl.py): every message sluice sends, packed
by ``cni.net.rtmsg``, on a plain synchronous socket (rtnl.py says why not
pyroute2's, with the figures).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from cni.net.netns import Netns
from cni.net.rtnl import NetlinkError, Rtnl
from cni.spec.errors import ERR_KERNEL, CNIError

__all__ = ["NetlinkError", "Rtnl", "is_missing", "kernel_op", "node_socket", "pod_socket"]


def node_socket() -> Rtnl:
    """A socket in the node's namespace (the caller's)."""
    return Rtnl()


def pod_socket(netns: Netns) -> Rtnl:
    """A socket bound to the pod's namespace, opened without a helper process."""
    with netns.entered():
        return Rtnl(netns)


def is_missing(err: NetlinkError) -> bool:
    return err.code in (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.EADDRNOTAVAIL)


@contextmanager
def kernel_op(what: str) -> Iterator[None]:
    """Turn a netlink failure into a CNI error saying what failed: ``failed to <what>: …``."""
    try:
        yield
    except NetlinkError as err:
        raise CNIError(
            ERR_KERNEL, f"failed to {what}: {err.args[1] if len(err.args) > 1 else err}"
        ) from None
