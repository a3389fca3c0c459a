"""kind v0.33.0 creates a cluster from the node image for real (make kind-test).

The control plane comes up, every node registers (NotReady: there is no CNI
until sluice's DaemonSet), the static pods and kube-proxy run, each node has its
/24 of the pod subnet, the sluice image is loaded into every node; deleting it
puts back the kernel settings the nodes' kubelets turned. KIND_TEST_NODES (1)
sets the node count.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import docker
import pytest

from tests.harness import dockerd, kind, kind_image

pytestmark = [pytest.mark.docker, pytest.mark.kind, pytest.mark.slow]

NODES = int(os.environ.get("KIND_TEST_NODES") or 1)


def kernel_settings() -> dict[str, str]:
    return {
        name: (Path("/proc/sys") / name).read_text().strip()
        for name in kind.KERNEL_WIDE_SYSCTLS
        if (Path("/proc/sys") / name).exists()
    }


def test_a_cluster_comes_up_and_goes_away(docker_client: docker.DockerClient) -> None:
    daemon = dockerd.running()
    assert daemon is not None
    kind_image.build(docker_client)
    built, tar = kind.build_sluice_image(docker_client)
    cluster = f"sluice-test-{uuid.uuid4().hex[:6]}"
    before = kernel_settings()
    try:
        kind.create(daemon, docker_client, cluster, NODES)
        loaded = kind.load(docker_client, cluster, tar)
        assert len(loaded) == NODES
        checked = kind.check_cluster(docker_client, cluster, NODES)
        assert len(checked["nodes"]) == NODES
        nodes = json.loads(kind.kubectl(cluster, "get", "nodes", "-o", "json"))["items"]
        cidrs = sorted(n["spec"]["podCIDR"] for n in nodes)
        assert len(set(cidrs)) == NODES
        assert all(c.startswith("10.244.") and c.endswith(".0/24") for c in cidrs), cidrs
        ready = [
            c["status"] for n in nodes for c in n["status"]["conditions"] if c["type"] == "Ready"
        ]
        assert ready == ["False"] * NODES  # no CNI yet
        for node in kind.node_containers(docker_client, cluster):
            images = node.exec_run(["crictl", "images", "-o", "json"]).output
            tags = {t for i in json.loads(images)["images"] for t in i["repoTags"]}
            assert built.name in tags
    finally:
        kind.delete(daemon, cluster)
    assert not kind.node_containers(docker_client, cluster)
    assert kernel_settings() == before
