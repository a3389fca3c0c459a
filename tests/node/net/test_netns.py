"""Entering pod namespaces in-process: no helper process, the caller's namespace kept."""

from __future__ import annotations

import os

import pytest

from cni.net import link
from cni.net.netlink import pod_socket
from cni.net.netns import Netns, NetnsGone, NotANetns
from tests.harness.cni_run import PodNamespaces, in_netns


def test_pod_socket_opens_without_forking(
    pods: PodNamespaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = pods.new()
    in_netns(
        path, "ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1", check=True
    )

    def no_fork() -> int:
        raise AssertionError("a helper process was forked")

    monkeypatch.setattr(os, "fork", no_fork)
    home = os.stat("/proc/thread-self/ns/net").st_ino
    with Netns(path) as netns, pod_socket(netns) as pod:
        assert link.get_link(pod, "probe0") is not None
        assert not netns.is_current()
    assert os.stat("/proc/thread-self/ns/net").st_ino == home


def test_missing_and_wrong_paths(tmp_path: object) -> None:
    with pytest.raises(NetnsGone):
        Netns("/run/netns/slt-nothing-here")
    with Netns("/etc/hostname") as not_netns, pytest.raises(NotANetns), not_netns.entered():
        pass
