"""The netlink module stands alone: no pyroute2 behind it, its own error class."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

from cni.net.rtnl import NetlinkError, Rtnl

ROOT = Path(__file__).resolve().parents[3]


def test_importing_it_loads_no_pyroute2() -> None:
    code = "import sys, cni.net.netlink; print(sorted(m for m in sys.modules if 'pyroute2' in m))"
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = [{str(ROOT)!r}]; {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_the_error_carries_the_kernels_code_and_message() -> None:
    err = NetlinkError(errno.ENODEV)
    assert err.code == errno.ENODEV and err.args == (errno.ENODEV, "No such device")
    assert NetlinkError(errno.EEXIST, "File exists (veth)").args[1] == "File exists (veth)"


def test_only_the_typed_operations_are_offered() -> None:
    assert not hasattr(Rtnl, "__getattr__") and not hasattr(Rtnl, "full")
