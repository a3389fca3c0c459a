"""The Vagrantfile cannot boot here (no hypervisor): `vagrant validate` checks it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
VAGRANTFILE = REPO_ROOT / "Vagrantfile"


def test_the_vagrantfile_is_valid(tmp_path: Path) -> None:
    vagrant = shutil.which("vagrant")
    assert vagrant or shutil.which("ruby"), "neither Debian's vagrant nor ruby is installed"
    if vagrant is None:  # only a syntax check is possible then
        proc = subprocess.run(["ruby", "-c", str(VAGRANTFILE)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return
    # Its state goes to tmp_path, not the checkout or root's home.
    env = {
        **os.environ,
        "VAGRANT_CWD": str(REPO_ROOT),
        "VAGRANT_HOME": str(tmp_path / "home"),
        "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),
        "VAGRANT_CHECKPOINT_DISABLE": "1",
    }
    proc = subprocess.run(
        [vagrant, "validate", "--ignore-provider"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout


def test_the_vm_is_provisioned_by_the_script_make_kind_runs() -> None:
    text = VAGRANTFILE.read_text()
    assert 'path: "tests/harness/kind-host.sh"' in text
    assert '"--make-kind"' in text
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "sh tests/harness/kind-host.sh" in makefile
    assert "kind: kind-image" in makefile
    assert "VM_CPUS = 2" in text
    memory = int(text.split("VM_MEMORY_MB = ")[1].split()[0])
    assert memory >= 4096
