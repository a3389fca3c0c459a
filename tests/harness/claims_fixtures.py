"""pytest fixtures for the prefix-claim tests (``pytest_plugins =
["tests.harness.claims_fixtures"]``).

* ``claims_control_plane`` (session): etcd, kube-apiserver and kube-controller-manager
  (whose garbage collector deletes the claims of a deleted Node) on port base 29000,
  so that it takes no host lock and may run beside other clusters; with
  conf/prefixclaims.yaml applied.
* ``agent_kubeconfig`` (session): a ServiceAccount's kubeconfig that may do only what
  the agent needs for claims (``claims.AGENT_RULES``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.claims import AGENT_ACCOUNT, AGENT_RULES, CRD, apply
from tests.harness.cluster import Cluster
from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip

CLAIMS_CLUSTER = "pytest-claims"
CLAIMS_PORT_BASE = 29000


@pytest.fixture(scope="session")
def claims_control_plane() -> Iterator[Cluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = Cluster(
        CLAIMS_CLUSTER,
        cache=_cache_or_skip(),
        port_base=CLAIMS_PORT_BASE,
        keep_logs=Path(keep_logs) / CLAIMS_CLUSTER if keep_logs else None,
        control_plane_only=True,
    )
    if cluster.is_up():
        cluster.down()  # what a crashed earlier run left
    cluster.up()
    try:
        cluster.kubectl("apply", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRD))
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster {CLAIMS_CLUSTER} left behind: {leftovers}"


@pytest.fixture(scope="session")
def agent_kubeconfig(
    claims_control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig of a ServiceAccount that may do only AGENT_RULES (every user of
    the harness's token file is an admin: RBAC is tested through this one)."""
    cluster = claims_control_plane
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"}
    documents = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": AGENT_ACCOUNT, "namespace": "kube-system"}},
        {**role, "metadata": {"name": AGENT_ACCOUNT}, "rules": AGENT_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": AGENT_ACCOUNT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": AGENT_ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": AGENT_ACCOUNT,
                       "namespace": "kube-system"}]},
    ]  # fmt: skip
    apply(cluster, *documents)
    token = cluster.kubectl(
        "create", "token", AGENT_ACCOUNT, "-n", "kube-system", "--duration=6h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in admin["users"]:
        user["user"] = {"token": token}
    path = tmp_path_factory.mktemp("agent-kubeconfig") / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    path.chmod(0o600)
    return path
