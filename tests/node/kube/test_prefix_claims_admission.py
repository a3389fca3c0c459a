"""conf/sluice-rbac.yaml's ValidatingAdmissionPolicy sluice-prefix-claims, in a real
kube-apiserver: a credential bound to a node (the token of a pod scheduled there)
writes only that node's PrefixClaims.

The credential is the real thing: a ServiceAccount token bound to a Pod whose
spec.nodeName is the node, which kube-apiserver turns into user info carrying the
node's name (checked with ``kubectl auth whoami`` first, so the test cannot pass
because the name is missing). The agent's own claim code runs under the policy; then
every write a compromised node could try on another node's claim is sent and refused.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.kube import prefixclaims
from cni.kube.api import Api, ApiError
from tests.harness.claims import (
    AGENT_ACCOUNT,
    apply,
    claim_objects,
    claims_by_node,
    create_node,
    delete_node,
    unique_pool,
)
from tests.harness.cluster import Cluster
from tests.harness.waiting import eventually
from tests.node.kube.test_prefix_claims_api import NETWORK, finish, plugin, start_worker

pytest_plugins = ["tests.harness.claims_fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
RBAC = ROOT / "conf" / "sluice-rbac.yaml"
POLICY = "sluice-prefix-claims"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
REFUSED = "may write only that node's PrefixClaims"


def policy_documents() -> list[dict[str, Any]]:
    """The policy and its binding, as shipped."""
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    found = [d for d in documents if d["metadata"]["name"] == POLICY]
    assert {d["kind"] for d in found} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    return found


class Credential:
    """kubectl with one user's kubeconfig."""

    def __init__(self, cluster: Cluster, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.cache.binary("kubectl")), f"--kubeconfig={self.kubeconfig}"]
        return subprocess.run(
            [*argv, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
        )


@pytest.fixture
def node_bound(
    claims_control_plane: Cluster, agent_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[Credential, str, str]]:
    """(credential of node "mine", its name, another node's name), the policy applied;
    everything removed afterwards (the claims go with their Nodes)."""
    cluster = claims_control_plane
    tag = uuid.uuid4().hex[:8]
    mine, other = f"adm-{tag}-mine", f"adm-{tag}-other"
    account, binding = f"claims-node-{tag}", f"claims-node-{tag}"
    policy = policy_documents()
    apply(cluster, *policy)
    try:
        create_node(cluster, mine)
        create_node(cluster, other)
        with cluster.fresh_namespace() as namespace:
            apply(
                cluster,
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": account, "namespace": namespace}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": binding},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": AGENT_ACCOUNT},  # the agent's claim rules (the fixture's)
                 "subjects": [{"kind": "ServiceAccount", "name": account,
                               "namespace": namespace}]},
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "agent", "namespace": namespace},
                 "spec": {"nodeName": mine, "serviceAccountName": account,
                          "containers": [{"name": "agent", "image": "localhost/none"}]}},
            )  # fmt: skip
            token = cluster.kubectl(
                "create", "token", account, "-n", namespace, "--duration=1h",
                "--bound-object-kind=Pod", "--bound-object-name=agent",
            ).stdout.strip()  # fmt: skip
            config = yaml.safe_load(cluster.kubeconfig.read_text())
            for user in config["users"]:
                user["user"] = {"token": token}
            path = tmp_path / "node-bound.kubeconfig"
            path.write_text(yaml.safe_dump(config))
            path.chmod(0o600)
            try:
                yield Credential(cluster, path), mine, other
            finally:
                # No kubelet confirms the pod's end: without the force the namespace
                # waits for it forever.
                cluster.kubectl("delete", "pod", "agent", "-n", namespace, "--grace-period=0",
                                "--force", "--ignore-not-found")  # fmt: skip
                cluster.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found")
    finally:
        delete_node(cluster, mine)
        delete_node(cluster, other)
        for document in reversed(policy):
            cluster.kubectl("delete", document["kind"], POLICY, "--ignore-not-found")


def run_claims(kubeconfig: Path, tmp_path: Path, node: str, pool: str, **job: Any) -> Any:
    """The agent's claim code (tests/harness/claim_worker.py) for ``node``."""
    ipam = plugin(tmp_path, node, pool, warmPrefixes=0, cooldownSeconds=0)
    return finish(start_worker(kubeconfig, {"plugin": ipam, **job}))


def test_a_node_bound_credential_writes_only_its_own_nodes_claims(
    claims_control_plane: Cluster, node_bound: tuple[Credential, str, str], tmp_path: Path
) -> None:
    cluster = claims_control_plane
    credential, mine, other = node_bound
    whoami = json.loads(credential.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["extra"][NODE_NAME_KEY] == [mine], whoami

    # The agent's own code, as node "mine": claims a block, then gives everything back.
    pool = unique_pool()
    held = run_claims(credential.kubeconfig, tmp_path, mine, pool, count=3)["held"]
    assert len(held) == 1 and claims_by_node(cluster, pool)[mine] == held
    released = run_claims(credential.kubeconfig, tmp_path, mine, pool, count=0, release=True)
    assert released["held"] == [] and released["errors"] == []
    eventually(
        lambda: all(o["spec"].get("releasedAt") for o in claim_objects(cluster, pool)),
        "its claim given back (a patch of its own claim)",
    )
    for claim in claim_objects(cluster, pool):  # and deleted, as after its cooldown
        deleted = credential.kubectl("delete", "prefixclaim", claim["metadata"]["name"])
        assert deleted.returncode == 0, deleted.stderr

    # Another node's block: neither created nor, once the other holds it, changed or
    # deleted by this credential.
    blocks = list(ipaddress.IPv4Network(pool).subnets(new_prefix=28))
    other_uid = cluster.kubectl_json("get", "node", other)["metadata"]["uid"]
    forged = prefixclaims.claim_object(blocks[5], ipaddress.IPv4Network(pool), other, other_uid,
                                       NETWORK)  # fmt: skip
    created = credential.kubectl("create", "-f", "-", stdin=json.dumps(forged))
    assert created.returncode != 0 and REFUSED in created.stderr, created.stderr
    assert not claim_objects(cluster, pool)

    theirs = prefixclaims.claim_object(blocks[6], ipaddress.IPv4Network(pool), other, other_uid,
                                       NETWORK)  # fmt: skip
    apply(cluster, theirs)  # an administrator's credential is not limited
    name = theirs["metadata"]["name"]
    # The requests the agent's own API client sends, with the verbs its rules grant.
    api = Api(str(credential.kubeconfig))
    path = prefixclaims.path_of(blocks[6])
    attempts: dict[str, Callable[[], object]] = {
        "give it back": lambda: api.patch(
            path, {"spec": {"releasedAt": "2026-01-01T00:00:00.000000Z"}}
        ),
        "relabel it": lambda: api.patch(
            path, {"metadata": {"labels": {prefixclaims.NODE_LABEL: mine}}}
        ),
        "fake its usage": lambda: api.patch(f"{path}/status", {"status": {"used": 0, "free": []}}),
        "delete it": lambda: api.delete(path),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ApiError) as refused:
            attempt()
        assert refused.value.status == 403, f"{what}: {refused.value}"
        assert REFUSED in str(refused.value), f"{what}: {refused.value}"
    (kept,) = claim_objects(cluster, pool)
    assert (
        kept["spec"] == theirs["spec"]
        and kept["metadata"]["labels"] == (theirs["metadata"]["labels"])
    )
    assert "status" not in kept or kept["status"] != {"used": 0, "free": []}
    cluster.kubectl("delete", "prefixclaim", name)
