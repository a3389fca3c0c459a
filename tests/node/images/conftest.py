"""A Docker daemon for the image tests: the one that runs, else the project's own,
stopped again at the end of the session (and the host checked to be as it was)."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from tests.harness import dockerd
from tests.harness.docker_host import HostSnapshot


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    before = HostSnapshot.capture()
    daemon = dockerd.ensure()
    client = daemon.client()
    try:
        yield client
    finally:
        client.close()
        if daemon.started_now:
            done = dockerd.stop()
            # Someone else's kind cluster on it keeps the daemon (and its bridges) up.
            if any(line.startswith("stopped dockerd") for line in done):
                leftovers = before.differences()
                assert not leftovers, f"the Docker daemon left the host changed: {leftovers}"
