"""The agent against what should not stop it: stored objects that no longer read,
connections that trickle or never read their answer, a second agent for the same
network, and its health endpoints."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.agent import AgentNetwork, PolicyPod, namespace, pod_object, policy
from tests.harness.cni_run import PodNamespaces


@pytest.fixture
def net(tmp_path: Path, bin_dir: Path) -> Iterator[AgentNetwork]:
    made = AgentNetwork.create(tmp_path, bin_dir)
    try:
        made.start()
        yield made
    finally:
        made.cleanup()


def wired(net: AgentNetwork, pods: PodNamespaces, ns: str, name: str) -> PolicyPod:
    netns = pods.new()
    cid = f"{ns}-{name}-{uuid.uuid4().hex[:6]}"
    result = net.add(netns, cid, ns, name)
    return PolicyPod(ns, name, cid, netns, result["ips"][0]["address"].split("/")[0])


# -- the local manifest store --------------------------------------------------------------


def test_a_stored_object_that_no_longer_reads_is_refused_and_the_rest_served(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    """Rows that no longer read (damaged JSON; a policy without a name) are refused,
    logged and reported; the agent starts and enforces every other stored object."""
    net.apply(
        namespace("x", ns="x"),
        pod_object("x", "server", app="server"),
        policy("x", "deny-all", podSelector={}, policyTypes=["Ingress"]),
    )
    server = wired(net, pods, "x", "server")
    client = wired(net, pods, "x", "client")
    server.serve()
    try:
        assert client.reaches([(server.ip, 80, "tcp")]) == [False]
        net.stop()
        database = net.network.state_dir / "agent" / f"{net.network.name}.db"
        with sqlite3.connect(database) as db:
            db.execute(
                "INSERT INTO objects VALUES (?, ?, ?, ?)", ("Pod", "x", "torn", '{"kind": "Po')
            )
            nameless = '{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "spec": {}}'
            db.execute(
                "INSERT INTO objects VALUES (?, ?, ?, ?)", ("NetworkPolicy", "x", "", nameless)
            )
        net.start()
        status = net.ask({"op": "status"})
        assert status["ready"], status
        assert sorted(status["refusedObjects"]) == ["NetworkPolicy x/", "Pod x/torn"], status
        assert "Unterminated string" in status["refusedObjects"]["Pod x/torn"], status
        assert "refused the stored Pod x/torn" in net.agent.log()
        policies = net.ask({"op": "get", "what": "policies"})["policies"]
        assert [p["policy"] for p in policies] == ["x/deny-all"]
        assert client.reaches([(server.ip, 80, "tcp")]) == [False], "the stored policy holds"
    finally:
        server.stop_serving()
    for pod in (server, client):
        net.delete(pod.netns, pod.cid, pod.namespace, pod.name)
