"""Kernel settings under /proc/sys, written only when they differ.

A container that is not privileged sees /proc/sys read-only: the DaemonSet's agent
mounts the node's /proc/sys/net elsewhere and says where once, at start
(``use_root``); sysctls are per network namespace, read through the writer's own,
which is the node's (the agent is on the node's network)."""

from __future__ import annotations

import os

from cni.spec.errors import ERR_KERNEL, CNIError

DEFAULT_ROOT = "/proc/sys"
_root = DEFAULT_ROOT


def use_root(root: str) -> None:
    """Read and write the settings under ``root`` (a mount of the node's /proc/sys)
    from now on; ``net`` must be under it."""
    global _root
    if not os.path.isdir(os.path.join(root, "net")):
        raise CNIError(ERR_KERNEL, f'no kernel settings under "{root}": no "net" there')
    _root = root


def path(key: str) -> str:
    """The file of ``key`` (``net.ipv4.ip_forward``) under the settings' root."""
    return os.path.join(_root, *key.split("."))


def ensure(key: str, value: str) -> None:
    where = path(key)
    try:
        with open(where) as current:
            if current.read().strip() == value:
                return
        with open(where, "w") as setting:
            setting.write(value)
    except OSError as err:
        raise CNIError(
            ERR_KERNEL, f'failed to set {key}={value} ("{where}"): {err.strerror}'
        ) from None
