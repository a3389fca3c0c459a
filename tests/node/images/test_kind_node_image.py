"""The kind node image, booted as kind boots a node (privileged, its own cgroup
namespace, tmpfs /run and /tmp, a volume at /var, the host's modules and headers):
systemd reaches multi-user, containerd serves every preloaded image, bpffs is
mounted, the headers are there for bcc, and nothing is pulled."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from tests.harness import kind_image
from tests.harness.cache import K8S_VERSION

pytestmark = [pytest.mark.docker, pytest.mark.kind, pytest.mark.slow]


@pytest.fixture(scope="module")
def node(docker_client: docker.DockerClient) -> Iterator[docker.models.containers.Container]:
    kind_image.build(docker_client)
    name = f"sluice-nodetest-{uuid.uuid4().hex[:8]}"
    network = docker_client.networks.create(name, driver="bridge")
    container = docker_client.containers.run(
        kind_image.NODE_IMAGE,
        detach=True,
        name=name,
        hostname=name,
        network=name,
        privileged=True,
        tty=True,
        cgroupns="private",
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        tmpfs={"/run": "", "/tmp": ""},
        volumes={
            "/lib/modules": {"bind": "/lib/modules", "mode": "ro"},
            "/usr/src": {"bind": "/usr/src", "mode": "ro"},
        },
        # kind's --volume /var: an anonymous volume filled from the image.
        mounts=[docker.types.Mount("/var", None, type="volume")],
    )
    try:
        deadline = time.monotonic() + 60
        while (
            b"Reached target" not in container.logs()
            or b"Multi-User System" not in container.logs()
        ):
            container.reload()
            assert container.status == "running", container.logs().decode()[-3000:]
            assert time.monotonic() < deadline, container.logs().decode()[-3000:]
            time.sleep(0.5)
        yield container
    finally:
        container.remove(force=True, v=True)
        network.remove()


def sh(node: docker.models.containers.Container, command: str) -> str:
    result = node.exec_run(["sh", "-c", command])
    assert result.exit_code == 0, f"{command}: {result.output.decode()}"
    return result.output.decode()


def test_systemd_runs_the_nodes_services(node: docker.models.containers.Container) -> None:
    sh(node, "systemctl is-active containerd.service")
    state = node.exec_run(["systemctl", "is-system-running"]).output.decode().strip()
    assert state in ("running", "starting"), sh(node, "systemctl --failed --no-legend || true")
    assert sh(node, "cat /kind/version").strip() == K8S_VERSION
    for tool in ("kubeadm", "kubelet", "kubectl", "crictl"):
        sh(node, f"test -x /usr/bin/{tool}")
    sh(node, "test -x /opt/cni/bin/loopback && test -x /opt/cni/bin/portmap")
    assert K8S_VERSION in sh(node, "kubeadm version -o short")


def test_every_image_kubeadm_asks_for_is_preloaded(
    node: docker.models.containers.Container,
) -> None:
    listed = set(sh(node, f"kubeadm config images list --kubernetes-version {K8S_VERSION}").split())
    present = {
        f"{line.split()[0]}:{line.split()[1]}"
        for line in sh(node, "crictl images").splitlines()[1:]
    }
    assert listed <= present, listed - present


def test_bpffs_is_mounted_and_the_kernel_headers_reachable(
    node: docker.models.containers.Container,
) -> None:
    assert sh(node, "findmnt -n -o FSTYPE /sys/fs/bpf").strip() == "bpf"
    # build: the arch tree (-amd64), source: the common one (-common), as make setup links them.
    modules = "/lib/modules/$(uname -r)"
    sh(node, f"test -d {modules}/build/include && test -d {modules}/source/include/linux")


def test_a_pod_reaches_dockers_dns_through_the_node(
    node: docker.models.containers.Container,
) -> None:
    # What CoreDNS's upstream is: resolv.conf names the node's gateway, not 127.0.0.11.
    resolv = sh(node, "cat /etc/resolv.conf")
    assert "127.0.0.11" not in resolv
    gateway = sh(node, "ip -4 route show default | awk '{print $3}'").strip()
    assert f"nameserver {gateway}" in resolv
    name = node.name
    assert name in sh(node, f"getent hosts {name}")
