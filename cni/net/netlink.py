"""Netlink sockets for the node and for a pod, and error wrapping.

Importing this module loads pyroute2 (about 0.1 s); only verbs that touch the
kernel import it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni.errors import ERR_KERNEL, CNIError
from cni.net.netns import Netns

__all__ = ["IPRoute", "NetlinkError", "is_missing", "kernel_op", "pod_socket"]


def pod_socket(netns: Netns) -> IPRoute:
    """An IPRoute bound to the pod's namespace, opened without a helper process."""
    with netns.entered():
        return IPRoute()


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
