"""sluicectl uninstall: it refuses while pods are attached, then removes what install
and the pods' calls put on the node; the address store stays unless asked."""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.net import masq
from ipam.store import store_path
from tests.harness.cni_run import (
    TEST_NETWORK_PREFIX,
    Network,
    PodNamespaces,
    preload_datapath,
    sluice_networks,
    sluicectl,
)


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[tuple[Network, Path, Path]]:
    """(the network, its conflist, its bpfDir), installed into directories of the test's."""
    name = f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}"
    bin_dir, conf_dir, state = tmp_path / "bin", tmp_path / "net.d", tmp_path / "state"
    bpf_dir = Path(f"/sys/fs/bpf/slt-un-{uuid.uuid4().hex[:8]}")
    subnet = f"10.{random.randint(200, 239)}.{random.randint(0, 255)}.0/24"
    proc = sluicectl(
        *("install", "--bin-dir", bin_dir, "--conf-dir", conf_dir, "--name", name),
        *("--subnet", subnet, "--policy", "off", "--state-dir", state, "--bpf-dir", bpf_dir),
    )
    assert proc.returncode == 0, proc.stderr
    shutil.copy("/usr/lib/cni/loopback", bin_dir / "loopback")
    network = Network(name=name, subnet=subnet, state_dir=state, bin_dir=bin_dir)
    try:
        preload_datapath(conf_dir / "10-sluice.conflist")
        yield network, conf_dir / "10-sluice.conflist", bpf_dir
    finally:
        network.cleanup()
        shutil.rmtree(bpf_dir, ignore_errors=True)


def plugin_config(conflist: Path) -> dict:
    parsed = json.loads(conflist.read_text())
    return {"cniVersion": parsed["cniVersion"], "name": parsed["name"], **parsed["plugins"][0]}


def test_uninstall_refuses_while_pods_are_attached_then_removes_everything(
    installed: tuple[Network, Path, Path], pods: PodNamespaces
) -> None:
    network, conflist, bpf_dir = installed
    bin_dir = network.bin_dir
    config = plugin_config(conflist)
    netns = pods.new()
    network.add(netns, "c1", config=config)
    assert network.name in sluice_networks() and bpf_dir.is_dir()

    refused = sluicectl("uninstall", "--conf", conflist, "--bin-dir", bin_dir)
    assert refused.returncode == 1, refused.stdout
    assert "1 pod(s)" in refused.stderr and "c1/eth0" in refused.stderr, refused.stderr
    assert conflist.exists() and (bin_dir / "sluice").exists()  # nothing was touched

    network.delete(netns, "c1", config=config).ok()
    store = Path(store_path(str(network.state_dir), network.name))
    assert store.exists()
    done = sluicectl("uninstall", "--conf", conflist, "--bin-dir", bin_dir)
    assert done.returncode == 0, done.stderr
    assert not conflist.exists()
    assert not (bin_dir / "sluice").exists() and not (bin_dir / "sluice-ipam").exists()
    assert (bin_dir / "loopback").exists()  # not sluice's
    assert not bpf_dir.exists()
    assert network.name not in sluice_networks()
    assert store.exists() and "--remove-ipam" in done.stdout  # kept unless asked


def test_uninstall_force_and_remove_ipam(
    installed: tuple[Network, Path, Path], pods: PodNamespaces
) -> None:
    network, conflist, bpf_dir = installed
    config = plugin_config(conflist)
    netns = pods.new()
    network.add(netns, "c1", config=config)
    store = Path(store_path(str(network.state_dir), network.name))
    done = sluicectl(
        *("uninstall", "--conf", conflist, "--bin-dir", network.bin_dir),
        *("--force", "--remove-ipam"),
    )
    assert done.returncode == 0, done.stderr
    assert not conflist.exists() and not bpf_dir.exists()
    assert network.name not in sluice_networks()
    assert not list(store.parent.glob(f"{store.name}*"))
    masq.drop(network.name)


def test_uninstall_under_a_root_removes_the_runtime_the_launchers_name(tmp_path: Path) -> None:
    """As a container sees the node (--root): the runtime copy, the link and its target,
    goes with the launchers; a foreign file of the bin directory stays."""
    root = tmp_path / "host"
    name = f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}"
    bpf_dir = f"/sys/fs/bpf/slt-un-{uuid.uuid4().hex[:8]}"
    proc = sluicectl(
        *("install", "--root", root, "--runtime", "/opt/sluice/runtime", "--name", name),
        *("--state-dir", tmp_path / "state", "--bpf-dir", bpf_dir),
    )
    assert proc.returncode == 0, proc.stderr
    runtime = root / "opt" / "sluice" / "runtime"
    target = Path(os.path.realpath(runtime))
    assert runtime.is_symlink() and target.is_dir()
    (root / "opt/cni/bin/other").write_text("#!/bin/sh\n")
    done = sluicectl("uninstall", "--root", root, "--conf", "/etc/cni/net.d/10-sluice.conflist")
    assert done.returncode == 0, done.stderr
    assert not runtime.exists() and not runtime.is_symlink() and not target.exists()
    assert sorted(p.name for p in (root / "opt/cni/bin").iterdir()) == ["other"]
    assert not (root / "etc/cni/net.d/10-sluice.conflist").exists()
    assert "absent    datapath" in done.stdout


def test_conflist_only_unless_the_daemonset_lives(tmp_path: Path) -> None:
    """The preStop hook: with the API unreachable it takes the conflist away (the node
    turns NotReady), and leaves the launchers for the pods' DELs."""
    root = tmp_path / "host"
    proc = sluicectl("install", "--root", root, "--name", "x", "--state-dir", tmp_path / "s")
    assert proc.returncode == 0, proc.stderr
    nowhere = tmp_path / "kubeconfig"
    nowhere.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    done = sluicectl(
        *("uninstall", "--root", root, "--conflist-only"),
        *("--unless-daemonset", "kube-system/sluice-agent", "--kubeconfig", nowhere),
    )
    assert done.returncode == 0, done.stderr
    assert "cannot read daemonset" in done.stderr
    assert not (root / "etc/cni/net.d/10-sluice.conflist").exists()
    assert (root / "opt/cni/bin/sluice").exists()
