"""Three real nodes whose pods reach each other through sluice's VXLAN tunnel.

``vxlan_nodes`` (package): cluster ``pytest-v`` on port base 32000, three nodes as
in tests/node/cluster but installed with ``--routing=vxlan``: each agent keeps the
other nodes' pod ranges routed through ``sluice.vx``. It comes up once the native
cluster's package is done and goes when this package is; nothing of a node may be
left.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip
from tests.harness.multinode import MultiNodeCluster, running

VXLAN_NAME = "pytest-v"
VXLAN_PORT_BASE = int(os.environ.get("SLUICE_K8S_VXLAN_PORT_BASE", "32000"))


@pytest.fixture(scope="package")
def vxlan_nodes() -> Iterator[MultiNodeCluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = MultiNodeCluster(
        VXLAN_NAME,
        nodes=3,
        cache=_cache_or_skip(),
        port_base=VXLAN_PORT_BASE,
        install_args=["--policy=enforce", "--routing=vxlan"],
        routes="agent",
        keep_logs=Path(keep_logs) / VXLAN_NAME if keep_logs else None,
    )
    with running(cluster):
        yield cluster
