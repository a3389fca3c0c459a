"""Kernel settings under /proc/sys, written only when they differ."""

from __future__ import annotations

from cni.spec.errors import ERR_KERNEL, CNIError


def ensure(key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    try:
        with open(path) as current:
            if current.read().strip() == value:
                return
        with open(path, "w") as setting:
            setting.write(value)
    except OSError as err:
        raise CNIError(
            ERR_KERNEL, f'failed to set {key}={value} ("{path}"): {err.strerror}'
        ) from None
