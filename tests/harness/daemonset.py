"""sluice deployed as Kubernetes objects on a kind cluster: nothing is installed on
the host. The sluice image is loaded into each node's containerd, and
``conf/`` (the kustomization: CRDs, RBAC, ``conf/sluice.yaml``) is applied to the
cluster; the DaemonSet's init container writes the plugin onto each node, and its
agent runs there.

``DeployedCluster.up()`` checks on the way what a user would see: the nodes are
NotReady before the manifests are applied (no conflist), Ready only after the
init container wrote one, and CoreDNS then runs on sluice's network (its
addresses inside the node's podCIDR). ``roll_to(tag)`` rolls the DaemonSet to
another image tag and waits for the rollout.

    python -m tests.harness.daemonset up [--name N] [--nodes 1]   # prints KUBECONFIG=...
    python -m tests.harness.daemonset e2e [--name N]   # the whole Netpol suite on it
    python -m tests.harness.daemonset down [--name N]

``make kind`` is ``up --name $(KIND_CLUSTER) --nodes $(KIND_NODES)``; ``make kind-e2e``
runs ``e2e`` and tests/node/kind on that cluster.

The Docker daemon is ``tests/harness/dockerd.py``'s; the images are those of
``make image kind-image`` (built here if missing or out of date).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from tests.harness import dockerd, e2e, kind, kind_image, sluice_image
from tests.harness.cache import AGNHOST_IMAGE, K8sCache

CLUSTER = "sluice-ds"
CONF = kind.REPO_ROOT / "conf"
CONFLIST = "/etc/cni/net.d/10-sluice.conflist"
AGENT = ("kube-system", "sluice-agent")
READY_TIMEOUT = 600.0


class DeployFailed(Exception):
    pass


@dataclass
class DeployedCluster:
    name: str
    kubeconfig: Path
    cache: K8sCache  # e2e.test and kubectl, for tests/harness/e2e.py

    # -- clients ------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        return kind.kubectl(self.name, *args, check=check, timeout=timeout)

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def nodes(self, client: docker.DockerClient) -> list[Any]:
        return kind.node_containers(client, self.name)

    # -- state --------------------------------------------------------------------------

    def ready_nodes(self) -> dict[str, bool]:
        found = self.kubectl_json("get", "nodes")["items"]
        return {
            n["metadata"]["name"]: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions", [])
            )
            for n in found
        }

    def pod_cidrs(self) -> dict[str, str]:
        found = self.kubectl_json("get", "nodes")["items"]
        return {n["metadata"]["name"]: n["spec"].get("podCIDR", "") for n in found}

    def agent_pods(self) -> list[dict[str, Any]]:
        namespace, _ = AGENT
        selector = "app.kubernetes.io/component=agent"
        return self.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]

    def agent_image(self) -> str:
        namespace, name = AGENT
        spec = self.kubectl_json("get", "daemonset", "-n", namespace, name)["spec"]
        return str(spec["template"]["spec"]["containers"][0]["image"])

    # -- changes ------------------------------------------------------------------------

    def deploy(self, kustomization: Path = CONF, timeout: float = READY_TIMEOUT) -> float:
        """Apply a kustomization (conf/, or the overlay pinning the image by digest) and
        wait for the rollout and for every node Ready; the seconds."""
        started = time.monotonic()
        self.kubectl("apply", "--server-side", "-k", str(kustomization), timeout=timeout)
        namespace, name = AGENT
        self.kubectl(
            *("rollout", "status", "daemonset", name, "-n", namespace),
            f"--timeout={int(timeout)}s",
            timeout=timeout + 30,
        )
        kind.wait_for("every node Ready", lambda: all(self.ready_nodes().values()), timeout)
        return time.monotonic() - started

    def roll_to(self, image: str, timeout: float = READY_TIMEOUT) -> float:
        """Set the DaemonSet's image (init container and agent) and wait for the rollout."""
        namespace, name = AGENT
        started = time.monotonic()
        self.kubectl(
            *("set", "image", "daemonset", name, "-n", namespace),
            f"install={image}",
            f"agent={image}",
        )
        self.kubectl(
            *("rollout", "status", "daemonset", name, "-n", namespace),
            f"--timeout={int(timeout)}s",
            timeout=timeout + 30,
        )
        return time.monotonic() - started

    def wait_coredns(self, timeout: float = READY_TIMEOUT) -> list[str]:
        """CoreDNS's pod addresses once it is available (it runs on sluice's network)."""
        self.kubectl(
            *("rollout", "status", "deployment", "coredns", "-n", "kube-system"),
            f"--timeout={int(timeout)}s",
            timeout=timeout + 30,
        )
        pods = self.kubectl_json("get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns")
        return [p["status"].get("podIP", "") for p in pods["items"]]


def node_file(node: Any, path: str) -> str | None:
    """A file inside a kind node, or None when it is missing."""
    result = node.exec_run(["cat", path])
    return result.output.decode() if result.exit_code == 0 else None


def tagged_image(client: docker.DockerClient, cluster: str, tag: str) -> str:
    """The sluice image under another tag (same content) in every node's containerd:
    what a rolling update to a new image tag pulls."""
    name = f"{sluice_image.REPOSITORY}:{tag}"
    kind.tag(client, cluster, sluice_image.image_name(), name)
    return name


def up(
    name: str = CLUSTER, nodes: int = 1, routing: str = "native"
) -> tuple[DeployedCluster, dict[str, Any]]:
    """A kind cluster with sluice deployed from conf/ (its ``SLUICE_ROUTING`` set to
    ``routing``); what was checked on the way."""
    daemon = dockerd.ensure()
    client = daemon.client()
    try:
        kind_image.build(client)
        _, tar = kind.build_sluice_image(client)
        if name not in kind.clusters(daemon):
            kind.create(daemon, client, name, nodes)
        count = len(kind.node_containers(client, name))
        kind.load(client, name, tar)
        cache = K8sCache.default()
        kind.load(client, name, cache.image_tar(AGNHOST_IMAGE))  # the Netpol e2e specs' pods
        kind.check_cluster(client, name, count)
        cluster = DeployedCluster(name, kind.kubeconfig_path(name), cache)
        seen: dict[str, Any] = {}
        seen["ready before"] = cluster.ready_nodes()
        seen["conflist before"] = [node_file(n, CONFLIST) for n in cluster.nodes(client)]
        seen["image"] = sluice_image.pinned_reference(tar)
        settings = {"SLUICE_ROUTING": routing} if routing != "native" else None
        overlay = sluice_image.write_deploy_overlay(
            tar, kind.kubeconfig_path(name).parent / "deploy", settings
        )
        seen["deploy seconds"] = cluster.deploy(overlay)
        seen["ready after"] = cluster.ready_nodes()
        seen["conflists"] = [node_file(n, CONFLIST) for n in cluster.nodes(client)]
        seen["coredns"] = cluster.wait_coredns()
        seen["pod cidrs"] = cluster.pod_cidrs()
        return cluster, seen
    finally:
        client.close()


def down(name: str = CLUSTER) -> list[str]:
    return kind.down(name)


def run_netpol(name: str, report_dir: Path | None = None) -> e2e.Tally:
    """The whole ``[sig-network] Netpol`` suite (SCTP connectivity skipped) on the
    cluster, as tests/harness/e2e.py runs it on the single-host cluster."""
    cluster = DeployedCluster(name, kind.kubeconfig_path(name), K8sCache.default())
    # kind runs the ServiceAccount controller: the suite waits for each namespace's
    # "default" account, which a loaded machine creates late.
    return e2e.run_e2e(
        cluster,  # type: ignore[arg-type]
        focus=e2e.NETPOL_FOCUS,
        skip=e2e.NETPOL_SKIP,
        report_dir=report_dir,
        extra_args=["--e2e-verify-service-account=true"],
        echo=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.daemonset", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up")
    up_parser.add_argument("--name", default=CLUSTER)
    up_parser.add_argument("--nodes", type=int, default=1)
    up_parser.add_argument("--routing", choices=["native", "vxlan"], default="native")
    down_parser = commands.add_parser("down")
    down_parser.add_argument("--name", default=CLUSTER)
    e2e_parser = commands.add_parser("e2e", help="the Netpol e2e suite on a running cluster")
    e2e_parser.add_argument("--name", default=CLUSTER)
    e2e_parser.add_argument("--report-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "up":
        started = time.monotonic()
        cluster, seen = up(args.name, args.nodes, args.routing)
        seen["conflists"] = [bool(c) for c in seen["conflists"]]
        seen["conflist before"] = [bool(c) for c in seen["conflist before"]]
        seen["up seconds"] = round(time.monotonic() - started)
        print(json.dumps(seen, indent=2), file=sys.stderr)
        print(f"KUBECONFIG={cluster.kubeconfig}")
        daemon = dockerd.running()
        if daemon is not None and daemon.own:
            print(f"DOCKER_HOST={daemon.docker_host}")
        print(f"try: {kind.kubectl_binary()} --kubeconfig {cluster.kubeconfig} get pods -A -o wide")
    elif args.command == "e2e":
        tally = run_netpol(args.name, args.report_dir)
        print(tally.summary())
        return 1 if tally.failed or tally.exit_code != 0 else 0
    else:
        for line in down(args.name):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
