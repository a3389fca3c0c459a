"""The kind cluster the tests of this folder run on.

``KIND_CLUSTER`` (default ``sluice``) when it exists (``make kind-e2e`` runs these
after ``make kind``); otherwise each module makes a 3-node cluster of its own and
deletes it afterwards, routed as ``KIND_ROUTING`` says (native or vxlan).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.harness import daemonset, dockerd, kind
from tests.harness.daemonset import DeployedCluster

NODES = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[DeployedCluster]:
    name = os.environ.get("KIND_CLUSTER") or "sluice"
    daemon = dockerd.ensure()
    own = name not in kind.clusters(daemon)
    if own:
        name = f"sluice-model-{uuid.uuid4().hex[:4]}"
    try:
        routing = os.environ.get("KIND_ROUTING") or "native"
        deployed, _ = daemonset.up(name, nodes=NODES, routing=routing)
        yield deployed
    finally:
        if own:
            left = daemonset.down(name)
            assert all("failed" not in line for line in left), left
