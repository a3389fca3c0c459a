"""A control plane of the API client's own (etcd, kube-apiserver,
kube-controller-manager; port base 28000, so it takes no host lock), with sluice's
CRDs (the controller's objects, prefix claims), for the tests of the client and of
leader election under faults."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cluster import Cluster
from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip

KUBE_CLUSTER = "pytest-kube"
KUBE_PORT_BASE = 28000
CONF = Path(__file__).resolve().parents[3] / "conf"
CRDS = [CONF / "policyendpoints.yaml", CONF / "prefixclaims.yaml"]


@pytest.fixture(scope="session")
def kube_control_plane() -> Iterator[Cluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = Cluster(
        KUBE_CLUSTER,
        cache=_cache_or_skip(),
        port_base=KUBE_PORT_BASE,
        keep_logs=Path(keep_logs) / KUBE_CLUSTER if keep_logs else None,
        control_plane_only=True,
    )
    if cluster.is_up():
        cluster.down()  # what a crashed earlier run left
    cluster.up()
    try:
        for crds in CRDS:
            cluster.kubectl("apply", "-f", str(crds))
            cluster.kubectl("wait", "--for=condition=Established", "-f", str(crds))
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster {KUBE_CLUSTER} left behind: {leftovers}"
