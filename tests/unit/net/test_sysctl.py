"""Kernel settings written under another root (the DaemonSet's mount of the node's
/proc/sys/net, a container's own /proc/sys being read-only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.net import sysctl
from cni.spec.errors import ERR_KERNEL, CNIError


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "net" / "ipv4").mkdir(parents=True)
    (tmp_path / "net" / "ipv4" / "ip_forward").write_text("0\n")
    sysctl.use_root(str(tmp_path))
    try:
        yield tmp_path
    finally:
        sysctl.use_root(sysctl.DEFAULT_ROOT)


def test_a_setting_is_written_under_the_root(root: Path) -> None:
    sysctl.ensure("net.ipv4.ip_forward", "1")
    assert (root / "net" / "ipv4" / "ip_forward").read_text() == "1"
    assert sysctl.path("net.ipv6.conf.veth1.accept_ra") == str(
        root / "net" / "ipv6" / "conf" / "veth1" / "accept_ra"
    )


def test_an_equal_setting_is_not_written(root: Path) -> None:
    setting = root / "net" / "ipv4" / "ip_forward"
    setting.write_text("1\n")
    os.utime(setting, ns=(0, 0))
    sysctl.ensure("net.ipv4.ip_forward", "1")
    assert setting.stat().st_mtime_ns == 0  # not opened for writing


def test_a_missing_setting_is_a_kernel_error_naming_the_file(root: Path) -> None:
    with pytest.raises(CNIError) as err:
        sysctl.ensure("net.ipv4.no_such_setting", "1")
    assert err.value.code == ERR_KERNEL
    assert str(root / "net" / "ipv4" / "no_such_setting") in err.value.details


def test_a_root_without_net_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as err:
        sysctl.use_root(str(tmp_path))
    assert str(tmp_path) in err.value.details
    assert sysctl.path("net.ipv4.ip_forward") == "/proc/sys/net/ipv4/ip_forward"
