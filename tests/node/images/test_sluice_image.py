"""The sluice image (Dockerfile) does its three jobs for real.

* ``sluicectl --version``, the tag and the label agree with pyproject's version;
* ``sluicectl install --runtime ... --root /host`` (the DaemonSet's init container)
  leaves a plugin that runs on a node without Python;
* ``sluicectl agent`` compiles the datapath with the image's bcc against the
  host's kernel headers (mounted, as the DaemonSet mounts them) and pins it;
* its OCI tar loads into a containerd with ``ctr images import`` and runs there.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.harness import debian_base, sluice_image
from tests.harness.cache import PAUSE_IMAGE
from tests.harness.containerd import PrivateContainerd

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def image(docker_client: docker.DockerClient) -> sluice_image.Built:
    return sluice_image.build(docker_client)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    root.mkdir()
    return root


def run(client: docker.DockerClient, image: str, command: list[str], **kwargs: object) -> str:
    out = client.containers.run(image, command, remove=True, stderr=True, **kwargs)
    return out.decode()  # type: ignore[union-attr]


def test_version_tag_and_label_agree(
    docker_client: docker.DockerClient, image: sluice_image.Built
) -> None:
    version = sluice_image.version()
    assert image.name == f"localhost/sluice:{version}"
    labels = docker_client.images.get(image.name).labels
    assert labels["org.opencontainers.image.version"] == version
    assert run(docker_client, image.name, ["--version"]).strip() == f"sluicectl {version}"
    config = docker_client.images.get(image.name).attrs["Config"]
    assert config["Entrypoint"] == ["sluicectl"]


def test_the_init_containers_install_runs_on_a_node_without_python(
    docker_client: docker.DockerClient, image: sluice_image.Built, host_root: Path
) -> None:
    out = run(
        docker_client,
        image.name,
        ["install", "--runtime", "/opt/sluice/runtime", "--root", "/host", "--policy", "off",
         "--subnet", "10.244.9.0/24", "--no-ip-masq"],
        volumes={str(host_root): {"bind": "/host", "mode": "rw"}},
    )  # fmt: skip
    assert "no Python needed on the node" in out
    conflist = json.loads((host_root / "etc/cni/net.d/10-sluice.conflist").read_text())
    assert conflist["plugins"][0]["ipam"]["subnet"] == "10.244.9.0/24"
    # The Debian base has no Python: the launcher runs the runtime's own.
    answer = run(
        docker_client,
        debian_base.IMAGE,
        ["sh", "-c", "! command -v python3 && /opt/cni/bin/sluice </dev/null"],
        environment={"CNI_COMMAND": "VERSION"},
        volumes={
            str(host_root / "opt/sluice"): {"bind": "/opt/sluice", "mode": "ro"},
            str(host_root / "opt/cni/bin"): {"bind": "/opt/cni/bin", "mode": "ro"},
        },
    )
    assert "1.1.0" in json.loads(answer)["supportedVersions"]


@pytest.fixture
def agent_paths(tmp_path: Path) -> Iterator[dict[str, Path]]:
    token = uuid.uuid4().hex[:8]
    paths = {
        "bpf": Path(f"/sys/fs/bpf/sluice-imgtest-{token}"),
        "state": tmp_path / "state",
        "run": tmp_path / "run",
        "conf": tmp_path / "net.d",
    }
    for key in ("state", "run", "conf"):
        paths[key].mkdir()
    yield paths
    shutil.rmtree(paths["bpf"], ignore_errors=True)  # unpinning detaches what was attached


def test_the_agent_compiles_and_pins_the_datapath_with_the_hosts_headers(
    docker_client: docker.DockerClient, image: sluice_image.Built, agent_paths: dict[str, Path]
) -> None:
    bpf = agent_paths["bpf"]
    run(
        docker_client,
        image.name,
        ["install", "--root", "/host", "--conf-dir", "/net.d", "--bin-dir", "/bin",
         "--policy", "off", "--no-ip-masq", "--state-dir", "/var/lib/sluice-imgtest",
         "--bpf-dir", str(bpf), "--agent-socket", "/run/sluice-imgtest/agent.sock"],
        volumes={str(agent_paths["conf"].parent): {"bind": "/host", "mode": "rw"}},
    )  # fmt: skip
    # Its own network namespace (none): the agent touches no host interface here.
    agent = docker_client.containers.run(
        image.name,
        ["agent", "--conf", "/etc/cni/net.d/10-sluice.conflist"],
        detach=True,
        privileged=True,
        network_mode="none",
        name=f"sluice-imgtest-{uuid.uuid4().hex[:8]}",
        volumes={
            "/sys/fs/bpf": {"bind": "/sys/fs/bpf", "mode": "rw"},
            "/lib/modules": {"bind": "/lib/modules", "mode": "ro"},
            "/usr/src": {"bind": "/usr/src", "mode": "ro"},
            str(agent_paths["conf"]): {"bind": "/etc/cni/net.d", "mode": "ro"},
            str(agent_paths["state"]): {"bind": "/var/lib/sluice-imgtest", "mode": "rw"},
            str(agent_paths["run"]): {"bind": "/run/sluice-imgtest", "mode": "rw"},
        },
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            agent.reload()
            assert agent.status == "running", agent.logs().decode()[-3000:]
            if b"agent serving network" in agent.logs():
                break
            time.sleep(1)
        logs = agent.logs().decode()
        assert "compiled and pinned the datapath" in logs, logs[-3000:]
        assert (agent_paths["run"] / "agent.sock").is_socket()
        assert any(p.name.startswith("layout_") for p in bpf.iterdir())
        status = agent.exec_run(["sluicectl", "status", "--bin-dir", "/nonexistent"])
        assert b"status:      ready" in status.output, status.output.decode()
    finally:
        agent.stop(timeout=20)
        assert b"agent stopping" in agent.logs()
        agent.remove(force=True)


def test_the_oci_tar_loads_into_containerd_and_runs(
    docker_client: docker.DockerClient, image: sluice_image.Built, tmp_path: Path
) -> None:
    tar = sluice_image.write_oci_tar(docker_client, image.name, sluice_image.oci_tar_path())
    with PrivateContainerd(
        cni_bin_dir=tmp_path, cni_conf_dir=tmp_path, sandbox_image=PAUSE_IMAGE
    ) as containerd:
        assert containerd.import_image(tar) == image.name
        out = containerd.ctr(
            "run", "--rm", image.name, f"sluice-imgtest-{uuid.uuid4().hex[:8]}",
            "sluicectl", "--version", timeout=120,
        ).stdout  # fmt: skip
        assert out.strip() == f"sluicectl {sluice_image.version()}"
