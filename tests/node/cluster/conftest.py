"""A cluster of three real nodes on this machine (tests/harness/multinode.py).

``k8s_nodes`` (package): cluster ``pytest-m`` on port base 25000 (its own, so it
needs no lock on the host and runs beside the single-node ``k8s_cluster``), three
nodes, sluice enforcing policy with an agent on each node. Each agent keeps the
routes to the other nodes' podCIDRs (``NODE_ROUTES``). A state left
by a crashed earlier run is torn down first; at the end nothing of a node may be
left.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip
from tests.harness.multinode import MultiNodeCluster, running

NODES_NAME = "pytest-m"
NODES_PORT_BASE = int(os.environ.get("SLUICE_K8S_NODES_PORT_BASE", "25000"))
NODE_COUNT = 3
NODE_ROUTES = "agent"  # sluice's agent keeps one route per remote node


# Package scope: the three nodes (kubelets, containerds, agents) go as soon as this
# package's tests are done instead of idling through the rest of the session.
@pytest.fixture(scope="package")
def k8s_nodes() -> Iterator[MultiNodeCluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = MultiNodeCluster(
        NODES_NAME,
        nodes=NODE_COUNT,
        cache=_cache_or_skip(),
        port_base=NODES_PORT_BASE,
        install_args=["--policy=enforce"],
        routes=NODE_ROUTES,
        keep_logs=Path(keep_logs) / NODES_NAME if keep_logs else None,
    )
    with running(cluster):
        yield cluster
