"""conf/sluice-rbac.yaml's ValidatingAdmissionPolicy sluice-prefix-claims, in a real
kube-apiserver: a credential bound to a node (the token of a pod scheduled there)
writes only that node's PrefixClaims, and only blocks of the pool the policy's settings
name (the shipped policy, its two settings set to the test's pool and /28).

The credential is the real thing: a ServiceAccount token bound to a Pod whose
spec.nodeName is the node, which kube-apiserver turns into user info carrying the
node's name (checked with ``kubectl auth whoami`` first, so the test cannot pass
because the name is missing). The agent's own claim code runs under the policy; then
every write a compromised node could try on another node's claim, and every range it
could claim for itself, is sent and refused.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
PREFIX_LENGTH = 28
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
REFUSED = "may write only that node's PrefixClaims"
OUT_OF_POOL = "may claim only"
UNCONFIGURED = "names no usable prefix pool"
Net = ipaddress.IPv4Network


def policy_documents(pool: str = "", prefix_length: str = "") -> list[dict[str, Any]]:
    """The policy and its binding as shipped, its settings (the variables ``pool`` and
    ``prefixLength``) set to these values."""
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    found = [d for d in documents if d["metadata"]["name"] == POLICY]
    assert {d["kind"] for d in found} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    (policy,) = [d for d in found if d["kind"] == "ValidatingAdmissionPolicy"]
    settings = {v["name"]: v for v in policy["spec"]["variables"]}
    assert settings["pool"]["expression"] == settings["prefixLength"]["expression"] == "''"
    settings["pool"]["expression"] = json.dumps(pool).replace('"', "'")
    settings["prefixLength"]["expression"] = json.dumps(prefix_length).replace('"', "'")
    return found


def configure(cluster: Cluster, pool: str, prefix_length: str) -> None:
    apply(cluster, *policy_documents(pool, prefix_length))


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


@dataclass
class NodeBound:
    """A credential of node ``mine``; ``other`` is another node; ``pool`` the pool the
    policy's settings name (with /28 blocks)."""

    credential: Credential
    mine: str
    other: str
    pool: str

    @property
    def api(self) -> Api:
        return Api(str(self.credential.kubeconfig))


def claim_for(
    cluster: Cluster, block: str, node: str, pool: str, stated_pool: str | None = None
) -> dict[str, Any]:
    """The object the agent writes for ``block`` of ``pool``; ``stated_pool`` replaces
    the pool it states (spec and label)."""
    uid = cluster.kubectl_json("get", "node", node)["metadata"]["uid"]
    obj = prefixclaims.claim_object(Net(block), Net(pool), node, uid, NETWORK)
    if stated_pool is not None:
        obj["spec"]["pool"] = stated_pool
        obj["metadata"]["labels"][prefixclaims.POOL_LABEL] = prefixclaims.label_of(Net(stated_pool))
    return obj


def dry_run(credential: Credential, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """A create that goes through admission and stores nothing."""
    return credential.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))


@pytest.fixture
def node_bound(
    claims_control_plane: Cluster, agent_kubeconfig: Path, tmp_path: Path
) -> Iterator[NodeBound]:
    """A credential of a node, the policy applied with a pool of this test; everything
    removed afterwards (the claims go with their Nodes)."""
    cluster = claims_control_plane
    tag = uuid.uuid4().hex[:8]
    mine, other = f"adm-{tag}-mine", f"adm-{tag}-other"
    account, binding = f"claims-node-{tag}", f"claims-node-{tag}"
    pool = unique_pool()
    policy = policy_documents(pool, str(PREFIX_LENGTH))
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
            made = NodeBound(Credential(cluster, path), mine, other, pool)
            try:
                wait_until_enforced(cluster, made)
                yield made
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


def wait_until_enforced(cluster: Cluster, bound: NodeBound) -> None:
    """Until the new policy refuses another node's block and admits one of its own: a
    policy takes effect some time after it is written."""
    first = str(next(Net(bound.pool).subnets(new_prefix=PREFIX_LENGTH)))

    def enforced() -> bool:
        theirs = dry_run(bound.credential, claim_for(cluster, first, bound.other, bound.pool))
        ours = dry_run(bound.credential, claim_for(cluster, first, bound.mine, bound.pool))
        assert REFUSED in theirs.stderr, f"another node's block: {theirs.stderr.strip()}"
        assert ours.returncode == 0, f"a block of its own: {ours.stderr.strip()}"
        return True

    eventually(enforced, "the admission policy in force", timeout=60)


def run_claims(kubeconfig: Path, tmp_path: Path, node: str, pool: str, **job: Any) -> Any:
    """The agent's claim code (tests/harness/claim_worker.py) for ``node``."""
    ipam = plugin(tmp_path, node, pool, warmPrefixes=0, cooldownSeconds=0)
    return finish(start_worker(kubeconfig, {"plugin": ipam, **job}))


def test_a_node_bound_credential_writes_only_its_own_nodes_claims(
    claims_control_plane: Cluster, node_bound: NodeBound, tmp_path: Path
) -> None:
    cluster = claims_control_plane
    credential, mine, other, pool = (
        node_bound.credential, node_bound.mine, node_bound.other, node_bound.pool
    )  # fmt: skip
    whoami = json.loads(credential.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["extra"][NODE_NAME_KEY] == [mine], whoami

    # The agent's own code, as node "mine": claims a block, then gives everything back.
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
    blocks = list(ipaddress.IPv4Network(pool).subnets(new_prefix=PREFIX_LENGTH))
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


def hostile_ranges(pool: str) -> dict[str, tuple[str, str]]:
    """What a node could ask every route keeper to send to it, as (prefix, the pool the
    claim states), by what it is. The configured pool takes /28 blocks."""
    net = Net(pool)
    wider = net.supernet(new_prefix=16)
    beside = Net((int(net.broadcast_address) + 1, PREFIX_LENGTH))
    elsewhere = str(Net("10.127.255.0/24"))
    return {
        "the cloud metadata address": ("169.254.169.254/32", pool),
        "the metadata address, stating a pool of its own": (
            "169.254.169.254/32", "169.254.169.254/32",
        ),
        "an eighth of the address space": ("0.0.0.0/5", pool),
        "the node network": ("192.168.0.0/24", pool),
        "the whole pool": (pool, pool),
        "a block over the pool": (str(wider), pool),
        "a block of the pool too long": (str(next(net.subnets(new_prefix=29))), pool),
        "a block of the pool too short": (str(next(net.subnets(new_prefix=27))), pool),
        "a /28 beside the pool": (str(beside), pool),
        "a /28 of the pool, stating a wider pool": (
            str(next(net.subnets(new_prefix=PREFIX_LENGTH))), str(wider),
        ),
        "a /28 of another pool": (str(next(Net(elsewhere).subnets(new_prefix=28))), elsewhere),
    }  # fmt: skip


def test_a_node_bound_credential_claims_only_blocks_of_the_configured_pool(
    claims_control_plane: Cluster, node_bound: NodeBound
) -> None:
    """Every range a compromised node could ask the route keepers to send its way, in a
    claim of its own node: refused with 403, nothing stored. Its own /28 block of the
    pool is admitted, and an administrator's credential is limited as before (not at
    all)."""
    cluster = claims_control_plane
    mine, pool = node_bound.mine, node_bound.pool
    api = node_bound.api

    def type_checked() -> dict[str, Any]:
        policy = cluster.kubectl_json("get", "validatingadmissionpolicy", POLICY)
        status = policy.get("status") or {}
        assert status.get("observedGeneration") == policy["metadata"]["generation"], status
        return status

    status = eventually(type_checked, "the policy type-checked")
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status
    for what, (prefix, stated) in hostile_ranges(pool).items():
        forged = claim_for(cluster, prefix, mine, pool, stated)
        with pytest.raises(ApiError) as refused:
            api.create(prefixclaims.PATH, forged)
        assert refused.value.status == 403, f"{what}: {refused.value}"
        assert OUT_OF_POOL in str(refused.value), f"{what}: {refused.value}"
        assert prefix in str(refused.value), f"{what}: {refused.value}"
    assert not [o for o in claim_objects(cluster) if o["spec"]["node"] == mine]

    # A block of its own, and then the labels of it changed to say another pool or node.
    block = str(list(Net(pool).subnets(new_prefix=PREFIX_LENGTH))[3])
    api.create(prefixclaims.PATH, claim_for(cluster, block, mine, pool))
    path = prefixclaims.path_of(Net(block))
    try:
        for label, value in ((prefixclaims.POOL_LABEL, "10.0.0.0-8"),
                             (prefixclaims.NODE_LABEL, node_bound.other)):  # fmt: skip
            with pytest.raises(ApiError) as refused:
                api.patch(path, {"metadata": {"labels": {label: value}}})
            assert refused.value.status == 403, f"{label}: {refused.value}"
        (kept,) = [o for o in claim_objects(cluster, pool) if o["spec"]["prefix"] == block]
        assert kept["metadata"]["labels"] == {
            prefixclaims.NODE_LABEL: mine,
            prefixclaims.POOL_LABEL: prefixclaims.label_of(Net(pool)),
        }
        api.patch(f"{path}/status", {"status": {"used": 1, "free": []}})  # its own usage
    finally:
        api.delete(path)

    # An administrator is not limited by it: the cloud metadata address, for the other
    # node (what the route keeper test does with such a claim).
    prefix, stated = hostile_ranges(pool)["the cloud metadata address"]
    apply(cluster, claim_for(cluster, prefix, node_bound.other, pool, stated))
    cluster.kubectl("delete", "prefixclaim", prefixclaims.name_of(Net(prefix)))


UNUSABLE_SETTINGS = [
    ("", ""),  # as shipped
    ("not a pool", "28"),
    ("10.128.0.1/9", "28"),  # host bits set
    ("fd00::/64", "120"),
    (None, "8"),  # shorter than the pool's
    (None, "33"),
    (None, "twenty-eight"),
]


def test_without_a_usable_pool_a_node_bound_credential_claims_nothing(
    claims_control_plane: Cluster, node_bound: NodeBound
) -> None:
    """Settings that name no usable pool or prefix length let no node claim anything,
    and leave administrators alone."""
    cluster = claims_control_plane
    block = str(next(Net(node_bound.pool).subnets(new_prefix=PREFIX_LENGTH)))
    ours = claim_for(cluster, block, node_bound.mine, node_bound.pool)
    for pool, length in UNUSABLE_SETTINGS:
        setting = f"pool {pool!r}, prefixLength {length!r}"
        configure(cluster, node_bound.pool if pool is None else pool, length)
        eventually(
            lambda: UNCONFIGURED in dry_run(node_bound.credential, ours).stderr,
            f"{setting}: a block of the pool refused",
        )
        with pytest.raises(ApiError) as refused:
            node_bound.api.create(prefixclaims.PATH, ours)
        assert refused.value.status == 403, f"{setting}: {refused.value}"
        assert UNCONFIGURED in str(refused.value), f"{setting}: {refused.value}"
        admin = cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", stdin=json.dumps(ours), check=False
        )
        assert admin.returncode == 0, f"{setting}: an administrator refused: {admin.stderr}"
    assert not claim_objects(cluster, node_bound.pool)
