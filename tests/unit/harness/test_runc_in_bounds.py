"""runc_in_bounds: which spec it edits for which runc command, and what it keeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness import runc_in_bounds as wrapper


def test_create_and_run_edit_the_bundles_config(tmp_path: Path) -> None:
    argv = ["--root", "/run/runc", "--log", "/x/log.json", "--log-format", "json",
            "create", "--bundle", str(tmp_path), "--pid-file", "/x/pid", "ctr-id"]  # fmt: skip
    assert wrapper.spec_file(argv) == (tmp_path / "config.json", False)
    assert wrapper.spec_file(["run", f"--bundle={tmp_path}", "id"]) == (
        tmp_path / "config.json",
        False,
    )


def test_exec_edits_the_process_file() -> None:
    argv = ["--root", "/run/runc", "exec", "--process", "/tmp/p.json", "--detach", "id"]
    assert wrapper.spec_file(argv) == (Path("/tmp/p.json"), True)


def test_other_commands_are_passed_through_untouched() -> None:
    for command in (["--root", "create", "state", "id"], ["delete", "id"], ["kill", "id", "9"]):
        # "--root create": "create" is the root option's value, the command is "state".
        found = wrapper.spec_file(command)
        assert found is None, command


def test_capabilities_outside_the_bounding_set_are_dropped() -> None:
    caps = {
        "bounding": ["CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"],
        "effective": ["CAP_SYS_RESOURCE"],
        "permitted": ["CAP_SYS_ADMIN"],
    }
    assert wrapper.trim(caps, {"CAP_SYS_ADMIN", "CAP_NET_ADMIN"})
    assert caps == {
        "bounding": ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"],
        "effective": [],
        "permitted": ["CAP_SYS_ADMIN"],
    }
    assert not wrapper.trim(caps, {"CAP_SYS_ADMIN", "CAP_NET_ADMIN"})


def test_this_process_bounding_set_is_read() -> None:
    held = wrapper.bounding_set()
    assert held <= {f"CAP_{name}" for name in wrapper.CAPABILITIES}
    assert held  # any process holds some


def test_the_wrapper_rewrites_the_spec_and_execs_runc(tmp_path: Path) -> None:
    # A stand-in for runc that prints its arguments, to see the exec happen.
    fake_runc = tmp_path / "runc"
    fake_runc.write_text('#!/bin/sh\necho "$@"\n')
    fake_runc.chmod(0o755)
    spec = {"process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_NOT_A_THING"]}}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, wrapper.__file__, "create", "--bundle", str(tmp_path), "id"],
        env={"SLUICE_REAL_RUNC": str(fake_runc)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.split() == ["create", "--bundle", str(tmp_path), "id"]
    written = json.loads((tmp_path / "config.json").read_text())
    kept = written["process"]["capabilities"]["bounding"]
    assert "CAP_NOT_A_THING" not in kept
    assert kept == (["CAP_CHOWN"] if "CAP_CHOWN" in wrapper.bounding_set() else [])
