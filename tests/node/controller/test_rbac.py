"""Who may write sluice's policy objects, on a real API server (kube-apiserver 1.34,
ValidatingAdmissionPolicy GA) with ``conf/sluice-rbac.yaml`` applied: the controller's
ServiceAccount alone. A namespace tenant whose Role grants everything cannot (the
kinds are cluster-scoped: no Role reaches them), nor can another ServiceAccount that
a ClusterRole lets write them, nor an administrator (the admission policy refuses
them); the controller runs with exactly what its ClusterRole grants.

Every client here authenticates with a real ServiceAccount token (TokenRequest).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.kube.api import Api, ApiError
from cni.policy.model import (
    NAMESPACE_NAME_LABEL,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Pod,
    labels_of,
)
from cni.policy.published.names import (
    ADDRESS_SET,
    API_BASE,
    POLICY_ENDPOINTS,
    address_set_name,
    collection_path,
)
from cni.policy.published.render import address_set_object, policy_endpoints_object
from cni.policy.published.sets import AddressSetKey
from cni.policy.selectors import PodGroup
from tests.harness.cluster import Cluster
from tests.harness.controller import ControllerProcess
from tests.harness.k8s_objects import create_world
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

RBAC = Path(__file__).resolve().parents[3] / "conf" / "sluice-rbac.yaml"
CONTROLLER = ("kube-system", "sluice-controller")


def service_account_kubeconfig(
    cluster: Cluster, admin: Api, namespace: str, name: str, where: Path
) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest's token)."""
    answer = admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": answer["status"]["token"]}
    path = where / f"{namespace}-{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def secured(k8s_control_plane: Cluster) -> Iterator[Cluster]:
    """The control plane with sluice's RBAC and admission policy, in force."""
    cluster = k8s_control_plane
    cluster.kubectl("apply", "-f", str(RBAC))
    admin = Api(str(cluster.kubeconfig))
    probe = address_set(f"as-probe{uuid.uuid4().hex[:6]}")

    def refused() -> bool:  # the policy takes a moment to be loaded
        try:
            admin.create(collection_path(ADDRESS_SET), copy.deepcopy(probe))
        except ApiError as err:
            return err.status == 403
        admin.delete(f"{collection_path(ADDRESS_SET)}/{probe['metadata']['name']}")
        return False

    try:
        eventually(refused, "the admission policy in force", 60)
        yield cluster
    finally:
        admin.close()
        cluster.kubectl("delete", "-f", str(RBAC), "--ignore-not-found")


def address_set(set_id: str) -> dict[str, Any]:
    """An AddressSet shard exactly as the controller writes one (but for its id)."""
    body = address_set_object(AddressSetKey(PodGroup("x", None, LabelSelector())), 0, 1, [], [])
    body["metadata"]["name"] = address_set_name(set_id, 0)
    body["spec"]["setID"] = set_id
    return body


def writes(api: Api, body: dict[str, Any]) -> str:
    """Create, replace, delete: "ok", or the first refusal (status and message)."""
    name = body["metadata"]["name"]
    try:
        stored = api.create(collection_path(ADDRESS_SET), copy.deepcopy(body))
        stored["spec"]["pods"] = [{"pod": "x/intruder", "ips": ["10.9.9.9"]}]
        api.replace(f"{collection_path(ADDRESS_SET)}/{name}", stored)
        api.delete(f"{collection_path(ADDRESS_SET)}/{name}")
    except ApiError as err:
        return f"{err.status} {err}"
    return "ok"


def test_only_the_controllers_service_account_writes_policy_objects(
    secured: Cluster, tmp_path: Path
) -> None:
    cluster = secured
    admin = Api(str(cluster.kubeconfig))
    tenant_ns = f"tenant-{uuid.uuid4().hex[:6]}"
    manifest = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant_ns}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tenant", "namespace": tenant_ns},
        },
        {  # everything, in its own namespace
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "everything", "namespace": tenant_ns},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "everything", "namespace": tenant_ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "everything",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": tenant_ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "operator", "namespace": tenant_ns},
        },
        {  # another operator whose ClusterRole lets it write sluice's objects
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{tenant_ns}-sluice-writer"},
            "rules": [{"apiGroups": ["sluice.dev"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{tenant_ns}-sluice-writer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{tenant_ns}-sluice-writer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": tenant_ns}],
        },
    ]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(manifest))
    clients = {
        who: Api(str(service_account_kubeconfig(cluster, admin, ns, name, tmp_path)))
        for who, (ns, name) in {
            "tenant": (tenant_ns, "tenant"),
            "operator": (tenant_ns, "operator"),
            "controller": CONTROLLER,
        }.items()
    }
    try:
        set_id = f"as-forged{uuid.uuid4().hex[:6]}"
        # The tenant may do anything in its namespace, and nothing to sluice's kinds.
        tenant = writes(clients["tenant"], address_set(set_id))
        assert tenant.startswith("403") and "cannot create resource" in tenant, tenant
        # Nor through a namespaced path: there is none (a Role would reach it).
        forged_policy = policy_endpoints_object(
            NetworkPolicy(tenant_ns, "allow-all", LabelSelector()), "uid-1", 1, [], []
        )
        forged_policy["metadata"]["namespace"] = tenant_ns
        with pytest.raises(ApiError) as namespaced:
            clients["tenant"].create(
                f"{API_BASE}/namespaces/{tenant_ns}/policyendpoints", forged_policy
            )
        assert namespaced.value.status == 404, namespaced.value
        # RBAC lets the other operator and the administrator; the admission policy not.
        for who, api in (("operator", clients["operator"]), ("admin", admin)):
            refused = writes(api, address_set(set_id))
            assert refused.startswith("403"), (who, refused)
            assert "ValidatingAdmissionPolicy 'sluice-policy-objects'" in refused, (who, refused)
            assert "only the sluice controller" in refused, (who, refused)
        assert writes(clients["controller"], address_set(set_id)) == "ok"
        # Nobody else deletes what the controller wrote, either.
        kept = address_set(f"as-kept{uuid.uuid4().hex[:6]}")
        clients["controller"].create(collection_path(ADDRESS_SET), kept)
        path = f"{collection_path(ADDRESS_SET)}/{kept['metadata']['name']}"
        with pytest.raises(ApiError) as deleted:
            clients["operator"].delete(path)
        assert deleted.value.status == 403
        clients["controller"].delete(path)
    finally:
        for api in clients.values():
            api.close()
        cluster.kubectl(
            "delete", "namespace", tenant_ns, "--wait=false", "--ignore-not-found", check=False
        )
        cluster.kubectl(
            "delete", "clusterrole,clusterrolebinding", f"{tenant_ns}-sluice-writer",
            "--ignore-not-found", check=False,
        )  # fmt: skip
        admin.close()


def test_the_controller_publishes_with_its_service_account(
    secured: Cluster, tmp_path: Path
) -> None:
    """Everything the controller reads and writes, its ClusterRole and lease Role grant."""
    cluster = secured
    admin = Api(str(cluster.kubeconfig))
    prefix = f"r{uuid.uuid4().hex[:6]}"
    namespace, node = f"{prefix}-ns", f"{prefix}-n0"
    policy = NetworkPolicy(namespace, "deny", LabelSelector(), ("Ingress",))
    create_world(
        admin,
        [node],
        [Namespace(namespace, labels_of({NAMESPACE_NAME_LABEL: namespace}))],
        [Pod(namespace, "p", ips=("10.9.0.1",), node_name=node)],
        [policy],
    )
    kubeconfig = service_account_kubeconfig(cluster, admin, *CONTROLLER, tmp_path)
    controller = ControllerProcess(
        kubeconfig, tmp_path / "controller.log", "sa", "sluice-controller-rbac",
        "--lease-namespace", "kube-system",
    ).start()  # fmt: skip
    try:
        path = f"{collection_path(POLICY_ENDPOINTS)}/{namespace}.deny"
        published = eventually(
            lambda: admin.get(path),
            "the controller publishes the policy's PolicyEndpoints",
        )
        assert published["spec"]["policyNamespace"] == namespace
        assert not [m for m in controller.messages() if "failed" in m or "403" in m], (
            controller.log_tail()
        )
    finally:
        controller.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", node, "--ignore-not-found", check=False)
        admin.close()
