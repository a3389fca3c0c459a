"""Markers by what a test needs, so that a run can select what its machine can do.

- ``root``: every test under ``tests/node`` (real namespaces, veths, BPF, containerd);
  ``pytest -m "not root"`` runs the rest anywhere, without privileges.
- ``k8s``: a real Kubernetes from the harness (``tests/harness``); set by the modules
  that use it.

A run that selects ``root`` tests without being root stops before the first test,
saying so, instead of failing each test on its first namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NODE_TESTS = Path(__file__).resolve().parent / "node"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if NODE_TESTS in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.root)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if os.geteuid() == 0:
        return
    needing_root = [item.nodeid for item in session.items if item.get_closest_marker("root")]
    if needing_root:
        raise pytest.UsageError(
            f"{len(needing_root)} selected tests need root (e.g. {needing_root[0]}): "
            'run as root, or select the others with -m "not root"'
        )
