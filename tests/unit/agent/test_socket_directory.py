"""The agent's socket directory is its own and closed to others (0700)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cni.agent.server import ServerError, prepare_directory


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_directory_is_0700(tmp_path: Path) -> None:
    prepare_directory(str(tmp_path / "run" / "sluice"))
    assert mode(tmp_path / "run" / "sluice") == 0o700


def test_a_directory_a_hostpath_volume_made_is_closed(tmp_path: Path) -> None:
    made = tmp_path / "sluice"
    made.mkdir()
    made.chmod(0o755)  # what the kubelet's DirectoryOrCreate leaves
    prepare_directory(str(made))
    assert mode(made) == 0o700


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    made = tmp_path / "sluice"
    made.mkdir()
    made.chmod(0o777)
    with pytest.raises(ServerError, match="may be written by others"):
        prepare_directory(str(made))
    assert mode(made) == 0o777, "left as found"
