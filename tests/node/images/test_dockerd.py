"""The project's own Docker daemon: privileged containers run, and stopping it puts
the host back as it was (no bridges, chains, rules or sysctls of Docker's left)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.docker_host import HostSnapshot

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]

# Runs in a child process so that the daemon's paths (read at import) are the test's own.
SCRIPT = r"""
import io, json, sys, tarfile
import docker.types
from tests.harness import dockerd
daemon = dockerd.ensure()
assert daemon.started_now and daemon.own, daemon
client = daemon.client()
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as tar:
    tar.add("/bin/busybox", "bin/busybox")
    for applet in ("sh", "sleep", "grep"):
        link = tarfile.TarInfo(f"bin/{applet}"); link.type = tarfile.SYMTYPE
        link.linkname = "busybox"; tar.addfile(link)
client.api.import_image_from_data(layer.getvalue(), repository="localhost/sluice-test/bb", tag="1")
pool = docker.types.IPAMPool(subnet="fd00:5e1c:e::/64")
network = client.networks.create(sys.argv[1], driver="bridge", enable_ipv6=True,
    ipam=docker.types.IPAMConfig(pool_configs=[pool]))
out = client.containers.run("localhost/sluice-test/bb:1", ["grep", "CapBnd", "/proc/self/status"],
    privileged=True, network=sys.argv[1], remove=True).decode()
print(json.dumps({"privileged": out.strip()}))
print(json.dumps({"stopped": dockerd.stop()}))
"""


@pytest.fixture
def private_daemon_env() -> Iterator[dict[str, str]]:
    if Path("/var/run/docker.sock").exists() or os.environ.get("DOCKER_HOST"):
        pytest.fail("a system Docker daemon runs: this test starts one of the project's own")
    token = uuid.uuid4().hex[:8]
    run_dir = Path(f"/run/sluice-docker-test-{token}")
    data_root = Path(f"/var/cache/sluice/docker-test-{token}")
    yield {
        **os.environ,
        "SLUICE_DOCKER_RUN": str(run_dir),
        "SLUICE_DOCKER_ROOT": str(data_root),
        "PYTHONPATH": str(REPO_ROOT),
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(data_root, ignore_errors=True)


def test_the_daemon_runs_privileged_containers_and_leaves_no_trace(
    private_daemon_env: dict[str, str],
) -> None:
    before = HostSnapshot.capture()
    network = f"sluice-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, network],
        env=private_daemon_env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["privileged"].startswith("CapBnd:")
    stopped = lines[1]["stopped"]
    assert any(line.startswith("stopped dockerd") for line in stopped), stopped
    assert f"removed network {network}" in stopped
    # The IPv6 network turned the host's IPv6 forwarding on; stop() turned it back.
    assert before.differences() == []
