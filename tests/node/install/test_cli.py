"""sluicectl install and status, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.cni_run import exec_plugin, sluicectl


def test_install_writes_launchers_and_a_conflist(tmp_path: Path) -> None:
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    proc = sluicectl(
        "install",
        "--bin-dir",
        bin_dir,
        "--conf-dir",
        conf_dir,
        "--subnet",
        "10.244.3.0/24",
        "--name",
        "kind",
        "--cni-version",
        "1.0.0",
        "--state-dir",
        tmp_path / "state",
        "--chain",
        "portmap",
    )
    assert proc.returncode == 0, proc.stderr
    for executable in ("sluice", "sluice-ipam"):
        launcher = bin_dir / executable
        assert launcher.stat().st_mode & 0o111
        first = launcher.read_text().splitlines()[0]
        assert first.startswith("#!/") and first.endswith(" -IS")
        run = exec_plugin(launcher, "VERSION", b"{}").ok()
        assert "1.1.0" in run.out["supportedVersions"]
    conflist = json.loads((conf_dir / "10-sluice.conflist").read_text())
    assert conflist["name"] == "kind" and conflist["cniVersion"] == "1.0.0"
    sluice, portmap = conflist["plugins"]
    assert sluice["type"] == "sluice" and sluice["policy"] == "enforce", "enforce by default"
    assert sluice["ipam"] == {"type": "sluice-ipam", "subnet": "10.244.3.0/24"}
    assert sluice["stateDir"] == str(tmp_path / "state")
    assert sluice["datapath"] == {"attach": "tc"}, "tc filters unless bandwidth is chained"
    assert sluice["routing"] == "native"
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}
    # Installing again is harmless.
    assert sluicectl("install", "--bin-dir", bin_dir, "--conf-dir", conf_dir).returncode == 0


def test_install_attaches_with_tcx_when_bandwidth_is_chained(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    proc = sluicectl(
        *("install", "--bin-dir", tmp_path / "bin", "--conf-dir", conf_dir),
        *("--state-dir", tmp_path / "state", "--chain", "bandwidth"),
    )
    assert proc.returncode == 0, proc.stderr
    conflist = json.loads((conf_dir / "10-sluice.conflist").read_text())
    assert conflist["plugins"][0]["datapath"] == {"attach": "tcx"}
    refused = sluicectl(
        *("install", "--bin-dir", tmp_path / "bin", "--conf-dir", conf_dir),
        *("--chain", "bandwidth", "--attach", "tc"),
    )
    assert refused.returncode != 0 and "bandwidth" in refused.stderr


def test_install_writes_the_routing_mode(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    proc = sluicectl(
        *("install", "--bin-dir", tmp_path / "bin", "--conf-dir", conf_dir),
        *("--state-dir", tmp_path / "state", "--routing", "vxlan"),
    )
    assert proc.returncode == 0, proc.stderr
    sluice = json.loads((conf_dir / "10-sluice.conflist").read_text())["plugins"][0]
    assert sluice["routing"] == "vxlan" and "mtu" not in sluice  # the plugin takes 50 off
    refused = sluicectl(
        *("install", "--bin-dir", tmp_path / "bin", "--conf-dir", conf_dir),
        *("--routing", "geneve"),
    )
    assert refused.returncode != 0 and "geneve" in refused.stderr


def test_install_rejects_a_bad_subnet(tmp_path: Path) -> None:
    proc = sluicectl(
        "install", "--bin-dir", tmp_path, "--conf-dir", tmp_path, "--subnet", "10.1.2.3/24"
    )
    assert proc.returncode == 2 and "10.1.2.3/24" in proc.stderr


def test_install_refuses_what_it_cannot_write_safely(tmp_path: Path) -> None:
    where = ("install", "--bin-dir", tmp_path / "bin", "--conf-dir", tmp_path / "conf")
    for options, message in (
        (("--subnet", "10.1.0.0/24", "--subnet-from-node", "n1"), "not both"),
        (("--subnet-from-node", "Bad_Name"), "is not a node name"),
        (("--runtime", str(tmp_path / "a b")), "shell launcher"),
        (("--runtime", "relative/dir"), "must be absolute"),
    ):
        proc = sluicectl(*where, *options)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    unreachable = sluicectl(*where, "--subnet-from-node", "n1", "--kubeconfig", tmp_path / "x")
    assert unreachable.returncode == 1 and "failed to reach the API" in unreachable.stderr
    assert not (tmp_path / "conf").exists()  # refused before anything was written


def install(tmp_path: Path, *options: object) -> tuple[Path, Path]:
    """Install into scratch directories; return (bin dir, conflist)."""
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    proc = sluicectl(
        "install",
        "--bin-dir",
        bin_dir,
        "--conf-dir",
        conf_dir,
        "--state-dir",
        tmp_path / "state",
        *options,
    )
    assert proc.returncode == 0, proc.stderr
    return bin_dir, conf_dir / "10-sluice.conflist"


def test_status_reports_a_usable_install(tmp_path: Path) -> None:
    bin_dir, conf = install(tmp_path, "--subnet", "10.244.4.0/24", "--policy", "off")
    proc = sluicectl("status", "--conf", conf, "--bin-dir", bin_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "status:      ready" in proc.stdout
    assert "policy:      off: NetworkPolicy is NOT enforced" in proc.stdout
    assert "node-cidr 10.244.4.0/24: 0 allocated, 253 free" in proc.stdout

    (bin_dir / "sluice").unlink()
    proc = sluicectl("status", "--conf", conf, "--bin-dir", bin_dir)
    assert proc.returncode == 1 and "missing" in proc.stdout

    proc = sluicectl("status", "--conf", tmp_path / "nope.conflist", "--bin-dir", bin_dir)
    assert proc.returncode == 1 and "nope.conflist" in proc.stdout


def test_status_reports_why_an_add_would_fail(tmp_path: Path) -> None:
    bin_dir, conf = install(tmp_path, "--policy", "enforce")
    proc = sluicectl("status", "--conf", conf, "--bin-dir", bin_dir)
    assert proc.returncode == 1 and "code 50" in proc.stdout and "agent" in proc.stdout


def test_install_enforces_policy_unless_told_not_to(tmp_path: Path) -> None:
    """Without --policy the conflist enforces, so an install without its agent is not
    ready (an ADD would fail with code 11) rather than silently unenforced."""
    bin_dir, conf = install(tmp_path)
    assert json.loads(conf.read_text())["plugins"][0]["policy"] == "enforce"
    proc = sluicectl("status", "--conf", conf, "--bin-dir", bin_dir)
    assert proc.returncode == 1 and "policy:      enforce" in proc.stdout, proc.stdout
    assert "NOT enforced" not in proc.stdout


def test_install_runtime_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    """--runtime replaces DIR whole: a directory of other files (a CNI bin directory
    given by mistake), a file, a link elsewhere, or the bin directory itself is
    refused before anything is written, and left as it was."""
    plugins = tmp_path / "cni-bin"
    plugins.mkdir()
    for name in ("bridge", "host-local", "loopback"):
        (plugins / name).write_text("#!/bin/sh\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data").write_text("keep")
    (tmp_path / "link").symlink_to(elsewhere)
    (tmp_path / "file").write_text("keep")
    where = ("install", "--bin-dir", tmp_path / "bin", "--conf-dir", tmp_path / "conf")
    for runtime, message in (
        (plugins, "not sluice's (bridge, host-local, loopback"),
        (tmp_path / "link", "not a runtime copy of sluice's"),
        (tmp_path / "file", "is a file"),
        (tmp_path / "bin", "is or holds --bin-dir"),
        (Path("/opt/cni/bin"), "is a system directory"),
    ):
        proc = sluicectl(*where, "--runtime", runtime)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert sorted(p.name for p in plugins.iterdir()) == ["bridge", "host-local", "loopback"]
    assert (elsewhere / "data").read_text() == "keep" and (tmp_path / "file").read_text() == "keep"
    assert not (tmp_path / "conf").exists() and not (tmp_path / "bin").exists()
    # Its own copy, though, is replaced, and the copy before it removed.
    own = tmp_path / "opt" / "runtime"
    for _ in range(2):
        proc = sluicectl(*where, "--runtime", own)
        assert proc.returncode == 0, proc.stderr
    assert (own / ".sluice-runtime").is_file()
    assert [p.name for p in own.parent.iterdir() if p.name != "runtime"] == [own.resolve().name]
