"""Shared fixtures: an installed plugin, unique networks and pod namespaces.

Everything runs against the real kernel as root: real network namespaces,
veths, routes and nftables. Every fixture removes what it created, even when
the test fails; a session check fails loudly if anything was left behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cni_run import (
    TEST_BPF_DIR,
    TEST_NETNS_PREFIX,
    TEST_NETWORK_PREFIX,
    Network,
    PodNamespaces,
    leftover_links,
    sluice_networks,
)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
REFERENCE_PLUGINS = Path("/usr/lib/cni")


@pytest.fixture(scope="session")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CNI plugin directory as a node has it: sluice's launchers and the reference plugins."""
    path = tmp_path_factory.mktemp("cni-bin")
    conf = tmp_path_factory.mktemp("cni-conf")
    subprocess.run(
        [VENV_BIN / "sluicectl", "install", "--bin-dir", path, "--conf-dir", conf],
        check=True,
        capture_output=True,
    )
    for plugin in REFERENCE_PLUGINS.iterdir():
        (path / plugin.name).symlink_to(plugin)
    return path


@pytest.fixture
def network(tmp_path: Path, bin_dir: Path) -> Iterator[Network]:
    """A fresh sluice network with its own name, subnet and state directory."""
    net = Network(
        name=f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}",
        subnet=f"10.{random.randint(200, 239)}.{random.randint(0, 255)}.0/24",
        state_dir=tmp_path / "state",
        bin_dir=bin_dir,
    )
    try:
        yield net
    finally:
        net.cleanup()


@pytest.fixture
def pods() -> Iterator[PodNamespaces]:
    """Creates pod network namespaces on demand; removes them all afterwards."""
    namespaces = PodNamespaces(TEST_NETNS_PREFIX)
    try:
        yield namespaces
    finally:
        namespaces.cleanup()


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """After the whole run: no test namespace, veth or nftables chain may remain.
    Before it: the datapaths of test sessions that died are unpinned (their links to
    netfilter's hooks with them, which would judge this session's pods by stale maps)."""
    for stale in Path("/sys/fs/bpf").glob("slt-*"):
        pid = stale.name.removeprefix("slt-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    yield
    # The session's datapath (programs and maps pinned by the first ADD).
    shutil.rmtree(TEST_BPF_DIR, ignore_errors=True)
    assert not os.path.exists(TEST_BPF_DIR), f"could not unpin {TEST_BPF_DIR}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    netns = [n for n in listed.stdout.split() if n.startswith(TEST_NETNS_PREFIX)]
    links = leftover_links(TEST_NETWORK_PREFIX)
    chains = [n for n in sluice_networks() if n.startswith(TEST_NETWORK_PREFIX)]
    assert not (netns or links or chains), (
        f"left behind: netns {netns}, veths {links}, nftables chains {chains}"
    )


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path
