"""pytest fixtures for tests that need a real Kubernetes (marker ``k8s``).

Pull them into a test module with ``from tests.harness.fixtures import *`` names or
``pytest_plugins = ["tests.harness.fixtures"]``:

* ``k8s_cluster`` (session): a ``Cluster`` named ``pytest`` with sluice enforcing
  policy, its node agent watching the cluster's API. A state left by a crashed
  earlier run is torn down first; at the end of the session the cluster goes down
  and must leave nothing behind. Without the Kubernetes cache it fails where Go is
  installed (``make test`` builds the cache first) and skips only where it is not.
* ``k8s_namespace`` (function): a fresh namespace, deleted afterwards
  (``Cluster.fresh_namespace()`` is the same as a context manager, for wider scopes).
* ``k8s_control_plane`` (module): a control plane only (etcd, kube-apiserver,
  kube-controller-manager; cluster ``pytest-cp`` on port base 26000), with sluice's
  CRDs: for tests of the controller and the agent's sources with nodes that do not
  exist. It touches nothing on the node, so it may run beside ``k8s_cluster``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cache import K8sCache
from tests.harness.cluster import Cluster, sluice_agent_argv

CLUSTER_NAME = "pytest"
# A control plane of its own port base (SLUICE_K8S_CP_PORT_BASE) runs beside the one of
# 26000 and needs no lock on the host: it touches nothing on the node.
CONTROL_PLANE_PORT_BASE = int(os.environ.get("SLUICE_K8S_CP_PORT_BASE", "26000"))
CONTROL_PLANE_NAME = (
    "pytest-cp" if CONTROL_PLANE_PORT_BASE == 26000 else f"pytest-cp-{CONTROL_PLANE_PORT_BASE}"
)
CRDS = Path(__file__).resolve().parents[2] / "conf" / "policyendpoints.yaml"
KEEP_LOGS_ENV = "SLUICE_K8S_KEEP_LOGS"  # copy the components' logs here at teardown


def _cache_or_skip() -> K8sCache:
    cache = K8sCache.default()
    missing = cache.missing()
    if missing:
        message = (
            f"Kubernetes cache {cache.root} is not built ({missing[0].name} missing): "
            "run `make k8s-build`"
        )
        if shutil.which("go"):
            pytest.fail(message)
        pytest.skip(message)
    return cache


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    cache = _cache_or_skip()
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = Cluster(
        CLUSTER_NAME,
        cache=cache,
        keep_logs=Path(keep_logs) if keep_logs else None,
        agent_argv=sluice_agent_argv,
        install_args=["--policy=enforce"],
    )
    if cluster.is_up():
        cluster.down()  # what a crashed or interrupted earlier session left
    cluster.up()
    try:
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster {CLUSTER_NAME} left behind: {leftovers}"


@pytest.fixture
def k8s_namespace(k8s_cluster: Cluster) -> Iterator[str]:
    with k8s_cluster.fresh_namespace() as name:
        yield name


@pytest.fixture(scope="module")
def k8s_control_plane() -> Iterator[Cluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = Cluster(
        CONTROL_PLANE_NAME,
        cache=_cache_or_skip(),
        port_base=CONTROL_PLANE_PORT_BASE,
        keep_logs=Path(keep_logs) / CONTROL_PLANE_NAME if keep_logs else None,
        control_plane_only=True,
    )
    if cluster.is_up():
        cluster.down()
    cluster.up()
    try:
        cluster.kubectl("apply", "-f", str(CRDS))
        cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRDS))
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster {CONTROL_PLANE_NAME} left behind: {leftovers}"
