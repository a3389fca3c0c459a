"""conf/sluice.yaml against a real API server (kube-apiserver 1.34 with RBAC and the
CRDs): server-side dry runs of the manifests and the kustomization (the real schema,
not a YAML lint), then, applied for real, what each ServiceAccount may do
(``kubectl auth can-i --as``): every verb its code asks for, and some it must not have.
A control plane of its own on port base 31000 (no kubelet: nothing runs on a node).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cni.agent.kube_source import COLLECTIONS
from cni.agent.shard_source import controller_collections
from cni.controller.controller import INPUTS
from cni.plugin import release
from cni.policy.published.names import ADDRESS_SET, POLICY_ENDPOINTS, POLICY_TARGETS
from tests.harness.cluster import Cluster
from tests.harness.cni_run import sluicectl
from tests.harness.fixtures import KEEP_LOGS_ENV, _cache_or_skip

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CONF = Path(__file__).resolve().parents[3] / "conf"
CRDS = [CONF / "policyendpoints.yaml", CONF / "prefixclaims.yaml"]
MANIFESTS = [CONF / "sluice-rbac.yaml", CONF / "sluice.yaml"]
PORT_BASE = int(os.environ.get("SLUICE_K8S_PORT_BASE_DEPLOY", "31000"))
AGENT = "system:serviceaccount:kube-system:sluice-agent"
CONTROLLER = "system:serviceaccount:kube-system:sluice-controller"
PUBLISHED = (POLICY_ENDPOINTS, ADDRESS_SET, POLICY_TARGETS)


@pytest.fixture(scope="module")
def control_plane() -> Iterator[Cluster]:
    keep_logs = os.environ.get(KEEP_LOGS_ENV)
    cluster = Cluster(
        "pytest-deploy",
        cache=_cache_or_skip(),
        port_base=PORT_BASE,
        keep_logs=Path(keep_logs) / "pytest-deploy" if keep_logs else None,
        control_plane_only=True,
    )
    if cluster.is_up():
        cluster.down()
    cluster.up()
    try:
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster pytest-deploy left behind: {leftovers}"


def service_account_kubeconfig(cluster: Cluster, namespace: str, name: str, where: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (every user of the harness's
    own kubeconfig is an administrator)."""
    token = cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = where / f"{namespace}-{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def files(*paths: Path) -> list[str]:
    return [arg for path in paths for arg in ("-f", str(path))]


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resource_of(path: str) -> str:
    """``pods`` or ``networkpolicies.networking.k8s.io`` of a collection path."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        return parts[-1]
    return f"{parts[-1]}.{parts[1]}"


def can(cluster: Cluster, who: str, verb: str, resource: str, namespace: str | None) -> bool:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = cluster.kubectl("auth", "can-i", verb, resource, "--as", who, *scope, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


def published(kind: str) -> str:
    return f"{kind}.sluice.dev"


# -- offline: the files agree with the release ------------------------------------------


def test_every_image_is_the_releases() -> None:
    image = f"localhost/sluice:{release.VERSION}"
    found = []
    for doc in documents(CONF / "sluice.yaml"):
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec:
            found += [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]
    assert found and set(found) == {image}, found
    kustomization = yaml.safe_load((CONF / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "localhost/sluice", "newTag": release.VERSION}]


def test_the_install_container_has_no_privilege() -> None:
    """It only writes files: not privileged, no capability, no escalation, a read-only
    root file system (test_daemonset runs it so on a kind node)."""
    (agent,) = [d for d in documents(CONF / "sluice.yaml") if d["kind"] == "DaemonSet"]
    (install,) = agent["spec"]["template"]["spec"]["initContainers"]
    assert install["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_agent_has_two_capabilities_and_no_privilege() -> None:
    """NET_ADMIN and SYS_ADMIN only (test_daemonset reads the running agent's), and no
    mount that reaches back into the node (Bidirectional needs a privileged container)."""
    (agent,) = [d for d in documents(CONF / "sluice.yaml") if d["kind"] == "DaemonSet"]
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    context = container["securityContext"]
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for doc in documents(CONF / "sluice.yaml"):
        spec = doc.get("spec", {}).get("template", {}).get("spec") or {}
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            assert not c.get("securityContext", {}).get("privileged"), c["name"]
            propagations = {m.get("mountPropagation") for m in c.get("volumeMounts", [])}
            assert "Bidirectional" not in propagations, c["name"]


# -- the API server's own validation ----------------------------------------------------


def test_the_manifests_pass_a_server_side_dry_run(control_plane: Cluster) -> None:
    cluster = control_plane
    proc = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", *files(*CRDS, *MANIFESTS), check=False
    )
    assert proc.returncode == 0, proc.stderr
    kinds = {line.split()[0].split("/")[0] for line in proc.stdout.splitlines()}
    assert {"daemonset.apps", "deployment.apps", "configmap"} <= kinds, proc.stdout


def test_the_kustomization_passes_a_server_side_dry_run(control_plane: Cluster) -> None:
    built = control_plane.kubectl("kustomize", str(CONF)).stdout
    assert f"image: localhost/sluice:{release.VERSION}" in built
    proc = control_plane.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(CONF))
    assert "daemonset.apps/sluice-agent serverside-applied (server dry run)" in proc.stdout


def test_a_broken_manifest_fails_the_dry_run(control_plane: Cluster, tmp_path: Path) -> None:
    """The premise: the dry run checks the schema (a lint would pass this)."""
    docs = documents(CONF / "sluice.yaml")
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "one"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(daemonset))
    proc = control_plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", str(broken), check=False
    )
    assert proc.returncode != 0 and "maxUnavailable" in proc.stderr, proc.stderr


# -- RBAC, as each ServiceAccount ---------------------------------------------------------


@pytest.fixture(scope="module")
def applied(control_plane: Cluster) -> Cluster:
    cluster = control_plane
    cluster.kubectl("apply", "--server-side", *files(*CRDS))
    cluster.kubectl("wait", "--for=condition=Established", *files(*CRDS))
    cluster.kubectl("apply", "--server-side", *files(*MANIFESTS))
    return cluster


def agent_reads() -> set[str]:
    paths = {c[2] for c in COLLECTIONS} | {c[2] for c in controller_collections("n1")}
    return {resource_of(p) for p in paths} | {"nodes"}


def test_the_agent_may_read_what_it_watches_and_write_nothing_of_sluices(
    applied: Cluster,
) -> None:
    cluster = applied
    missing = [
        (verb, resource)
        for resource in sorted(agent_reads())
        for verb in ("list", "watch")
        if not can(cluster, AGENT, verb, resource, None)
    ]
    missing += [
        (verb, what)
        for verb, what, namespace in (
            ("get", "nodes", None),  # the init container's podCIDR
            ("create", "events", "default"),
            ("get", "daemonsets.apps/sluice-agent", "kube-system"),  # the preStop hook
        )
        if not can(cluster, AGENT, verb, what, namespace)
    ]
    assert not missing, f"the agent lacks {missing}"
    granted = [
        (verb, what, namespace)
        for verb, what, namespace in (
            *((v, published(k), None) for k in PUBLISHED for v in ("create", "update", "delete")),
            ("patch", published(POLICY_ENDPOINTS), None),
            ("create", "leases.coordination.k8s.io", "kube-system"),
            ("update", "nodes", None),
            ("delete", "pods", "default"),
            ("get", "secrets", "kube-system"),
            ("list", "secrets", None),
            ("get", "daemonsets.apps/kube-proxy", "kube-system"),
            ("update", "daemonsets.apps/sluice-agent", "kube-system"),
            ("create", "events", "kube-system"),
            ("patch", "networkpolicies.networking.k8s.io", "default"),
        )
        if can(cluster, AGENT, verb, what, namespace)
    ]
    assert not granted, f"the agent may {granted}"


def test_the_controller_may_write_sluices_objects_and_its_lease_only(applied: Cluster) -> None:
    cluster = applied
    needed = [
        *((v, resource_of(c[2]), None) for c in INPUTS for v in ("list", "watch")),
        *(
            (v, published(k), None)
            for k in PUBLISHED
            for v in ("get", "create", "update", "patch", "delete")
        ),
        *((v, "leases.coordination.k8s.io", "kube-system") for v in ("get", "create", "update")),
    ]
    missing = [n for n in needed if not can(cluster, CONTROLLER, *n)]
    assert not missing, f"the controller lacks {missing}"
    granted = [
        (verb, what, namespace)
        for verb, what, namespace in (
            ("create", "leases.coordination.k8s.io", "default"),
            ("update", "pods", "default"),
            ("get", "secrets", "kube-system"),
            ("delete", "nodes", None),
            ("create", "prefixclaims.sluice.dev", None),
            ("create", "networkpolicies.networking.k8s.io", "default"),
            ("get", "daemonsets.apps/sluice-agent", "kube-system"),
        )
        if can(cluster, CONTROLLER, verb, what, namespace)
    ]
    assert not granted, f"the controller may {granted}"


def test_the_prestop_hook_keeps_the_conflist_while_the_daemonset_lives(
    applied: Cluster, tmp_path: Path
) -> None:
    """As the agent's ServiceAccount: a live DaemonSet (a rolling update) keeps the
    node's conflist; once the DaemonSet is deleted the hook removes it."""
    cluster = applied
    root = tmp_path / "host"
    proc = sluicectl("install", "--root", root, "--state-dir", tmp_path / "state")
    assert proc.returncode == 0, proc.stderr
    conflist = root / "etc/cni/net.d/10-sluice.conflist"
    kubeconfig = service_account_kubeconfig(cluster, "kube-system", "sluice-agent", tmp_path)
    hook = (
        *("uninstall", "--root", root, "--conflist-only", "--kubeconfig", kubeconfig),
        "--unless-daemonset=kube-system/sluice-agent",
    )
    kept = sluicectl(*hook)
    assert kept.returncode == 0 and "lives on" in kept.stdout, kept.stdout + kept.stderr
    assert conflist.exists()
    cluster.kubectl("delete", "daemonset", "-n", "kube-system", "sluice-agent", "--wait")
    try:
        removed = sluicectl(*hook)
        assert removed.returncode == 0, removed.stderr
        assert not conflist.exists() and (root / "opt/cni/bin/sluice").exists()
    finally:
        cluster.kubectl("apply", "--server-side", "-f", str(CONF / "sluice.yaml"))
    assert cluster.kubectl_json("get", "ds", "-n", "kube-system", "sluice-agent")["metadata"]
