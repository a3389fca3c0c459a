"""`sluicectl install --runtime`: the plugin on a node without Python.

The launchers run in a mount namespace where this machine's Python is hidden:
its interpreter, standard library and packages, pyenv's and this checkout
(with its .venv) are covered by empty mounts, so any file the plugin reaches
outside its own runtime fails the call. Real netns, veths and nftables; the
agent, where one serves, runs outside the namespace as it would in its pod.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import loader
from cni.install.runtime import LIBRARY_DIRS
from tests.harness.agent import AgentNetwork
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces

ROOT = Path(__file__).resolve().parents[3]
SLUICECTL = ROOT / ".venv" / "bin" / "sluicectl"


def hidden_python() -> tuple[list[str], list[str]]:
    """(directories, files) that hold a Python this machine has."""
    directories = {
        sysconfig.get_paths()["stdlib"],
        "/usr/lib/python3",
        str(ROOT),
        os.path.expanduser("~/.pyenv"),
    }
    files = {os.path.realpath(getattr(sys, "_base_executable", sys.executable))}
    files.update(str(p) for p in Path("/usr/bin").glob("python3*"))
    files.update(str(p) for p in Path("/usr/local/bin").glob("python3*"))
    # nftables too (kind's node image has neither): the runtime brings libnftables.
    for directory in LIBRARY_DIRS:
        files.update(os.path.realpath(p) for p in Path(directory).glob("libnftables.so*"))
    files.update(("/usr/sbin/nft", "/sbin/nft"))
    return (
        sorted(d for d in directories if os.path.isdir(d)),
        sorted(f for f in files if os.path.isfile(f)),
    )


def without_python(command: str, extra_mounts: str = "") -> list[str]:
    """``command`` (shell) in a mount namespace where this machine's Python is hidden."""
    directories, files = hidden_python()
    mounts = [f"mount -t tmpfs none {shlex.quote(d)}" for d in directories]
    mounts += [f"mount --bind /dev/null {shlex.quote(f)}" for f in files]
    script = " && ".join([*mounts, *([extra_mounts] if extra_mounts else []), command])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script]


def wrap(bin_dir: Path, launchers: Path) -> None:
    """Executables in ``bin_dir`` that run ``launchers``' ones without this Python."""
    bin_dir.mkdir(exist_ok=True)
    for name in ("sluice", "sluice-ipam"):
        inner = shlex.join(without_python(f'exec {launchers / name} "$@"'))
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec {inner} sh "$@"\n')
        wrapper.chmod(0o755)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Launchers using a runtime copied with install --runtime, wrapped to hide Python."""
    work = tmp_path_factory.mktemp("runtime")
    subprocess.run(
        [
            SLUICECTL,
            "install",
            "--bin-dir",
            work / "launchers",
            "--conf-dir",
            work / "net.d",
            "--runtime",
            work / "opt" / "sluice",
        ],
        check=True,
        capture_output=True,
    )
    wrap(work / "bin", work / "launchers")
    # The plugin attaches what is pinned; bcc, its compiler, is not in the runtime.
    loader.ensure_loaded(TEST_BPF_DIR)
    yield work


@pytest.fixture(scope="module")
def bin_dir(runtime: Path) -> Path:
    """The CNI bin directory of this module's networks (conftest's ``network``): the
    wrapped runtime launchers."""
    return runtime / "bin"


def test_python_is_hidden_in_the_namespace() -> None:
    """The test's premise: neither the checkout nor an interpreter is reachable."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    probe = (
        f"test ! -e {ROOT / 'cni' / 'plugin' / 'main.py'} && "
        f"test ! -e {sysconfig.get_paths()['stdlib']}/os.py && "
        f"! {python} -c pass 2>/dev/null && ! /usr/bin/python3 -c pass 2>/dev/null && "
        "! nft list tables >/dev/null 2>&1 && echo hidden"
    )
    run = subprocess.run(without_python(probe), capture_output=True, text=True, check=False)
    assert run.stdout.strip() == "hidden", run.stdout + run.stderr


def test_the_runtime_is_self_contained(runtime: Path) -> None:
    opt = runtime / "opt" / "sluice"
    assert opt.is_symlink()  # switched in one rename when installed again
    lib = opt / "lib"
    assert (lib / "libc.so.6").exists() and list(lib.glob("ld-linux*"))
    assert (opt / "site" / "cni" / "plugin" / "main.py").exists() and (
        opt / "site" / "pyroute2"
    ).is_dir()
    assert not (opt / "site" / "bcc").exists()
    assert (lib / "libnftables.so.1").exists()
    launcher = (runtime / "launchers" / "sluice").read_text()
    assert launcher.startswith("#!/bin/sh") and f"{opt}/lib/ld-linux" in launcher


def test_add_check_del_in_process_without_python(
    network: Network, pods: PodNamespaces, runtime: Path
) -> None:
    version = network.run("VERSION").ok()
    assert "1.1.0" in version.out["supportedVersions"]
    netns = pods.new()
    result = network.add(netns, "c1")
    address = result["ips"][0]["address"].split("/")[0]
    inside = subprocess.run(
        ["ip", "-n", Path(netns).name, "-4", "-o", "addr", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert address in inside
    assert network.masqueraded() == {address}  # through the runtime's libnftables
    network.check(netns, "c1", result).ok()
    network.delete(netns, "c1").ok()
    assert network.veths() == [] and network.allocations() == {}


def test_with_nothing_pinned_an_add_fails_cleanly(
    network: Network, pods: PodNamespaces, runtime: Path
) -> None:
    """The runtime has no compiler: the ADD says so and where to pin, and leaves nothing."""
    bpf_dir = f"/sys/fs/bpf/slt-unpinned-{uuid.uuid4().hex[:8]}"
    try:
        refused = network.run(
            "ADD",
            network.config(bpfDir=bpf_dir),
            container_id="c1",
            netns=pods.new(),
            ifname="eth0",
        )
        assert refused.error_code == 100, refused.stdout
        assert "bcc is not available" in refused.out["details"]
        assert "sluicectl datapath load" in refused.out["details"]
        assert network.veths() == [] and network.allocations() == {}
    finally:
        subprocess.run(["rm", "-rf", bpf_dir], check=False)


def test_calls_go_to_the_agent_from_a_node_without_python(
    tmp_path: Path, pods: PodNamespaces, bin_dir: Path
) -> None:
    net = AgentNetwork.create(tmp_path, bin_dir)
    try:
        net.start()
        netns = pods.new()
        net.add(netns, "c1", "x", "a")
        assert [e["pod"] for e in net.endpoints()] == ["x/a"]
        net.delete(netns, "c1", "x", "a")
        assert net.endpoints() == []
    finally:
        net.cleanup()


def test_install_under_a_root_writes_node_paths(tmp_path: Path, pods: PodNamespaces) -> None:
    """As an init container does it: the node's filesystem mounted at --root, paths in
    the launchers and the conflist the node's own."""
    node_root = tmp_path / "host"
    on_node = f"/opt/slt-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            SLUICECTL,
            "install",
            "--root",
            node_root,
            "--bin-dir",
            f"{on_node}/cni/bin",
            "--conf-dir",
            f"{on_node}/net.d",
            "--runtime",
            f"{on_node}/runtime",
        ],
        check=True,
        capture_output=True,
    )
    copied = node_root / on_node.lstrip("/")
    launcher = (copied / "cni" / "bin" / "sluice").read_text()
    assert f"{on_node}/runtime/lib/" in launcher and str(node_root) not in launcher
    assert (copied / "net.d" / "10-sluice.conflist").exists()
    # The node's view: its /opt holds what the init container wrote.
    mount_node = (
        f"mount -t tmpfs none /opt && mkdir -p {on_node} && mount --bind {copied} {on_node}"
    )
    version = subprocess.run(
        without_python(f"exec {on_node}/cni/bin/sluice", mount_node),
        input=b'{"cniVersion": "1.0.0"}',
        env={"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]},
        capture_output=True,
        check=False,
    )
    assert b'"supportedVersions"' in version.stdout, version.stdout + version.stderr
