"""The agent against what should not stop it: stored objects that no longer read,
connections that trickle or never read their answer, a second agent for the same
network, and its health endpoints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cni.agent.server import REQUEST_DEADLINE
from cni.plugin import frames
from cni.plugin.client import AgentUnavailable
from tests.harness.agent import (
    AgentNetwork,
    PolicyPod,
    k8s_args,
    namespace,
    pod_object,
    policy,
)
from tests.harness.cni_run import SLUICECTL, PodNamespaces
from tests.harness.waiting import eventually

if TYPE_CHECKING:
    from cni.spec.invoke import Invocation


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


# -- the socket -----------------------------------------------------------------------------


def timed_delete(net: AgentNetwork, pod: PolicyPod) -> Invocation:
    cni_args = k8s_args(pod.namespace, pod.name)
    return net.network.delete(pod.netns, pod.cid, config=net.config(), cni_args=cni_args)


class Tricklers:
    """``count`` connections that each announce a 1 MiB request and send it a byte
    every ``interval`` seconds, until closed."""

    def __init__(self, path: str, count: int, interval: float = 0.5) -> None:
        self.socks = []
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.sendall(struct.pack(">I", frames.MAX_REQUEST))
            self.socks.append(sock)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._trickle, args=(interval,), daemon=True)
        self.thread.start()

    def _trickle(self, interval: float) -> None:
        while not self.stopped.wait(interval):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(b"C")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()


def test_a_del_completes_within_10_s_beside_64_trickling_connections(
    net: AgentNetwork, pods: PodNamespaces
) -> None:
    """64 connections (as many as the agent runs requests at once) that never finish
    sending hold no slot: a DEL, and then an ADD, are served by the agent at once."""
    pod = wired(net, pods, "x", "a")
    trickling = time.monotonic()
    tricklers = Tricklers(net.socket, 64)
    try:
        time.sleep(1.0)  # every trickler is being read
        started = time.monotonic()
        run = timed_delete(net, pod)
        took = time.monotonic() - started
        assert run.rc == 0, run.stdout + run.stderr
        assert took < 10.0, f"DEL took {took:.1f} s"
        released = lambda: net.network.veths() == [] and net.network.allocations() == {}  # noqa: E731
        eventually(released, "the DEL's release (after its answer)")
        again = wired(net, pods, "x", "b")  # through the agent: nothing runs ADD in-process
        net.delete(again.netns, again.cid, again.namespace, again.name)
        # Each trickler is cut off at the request's deadline, however often it sends.
        time.sleep(max(0.0, trickling + REQUEST_DEADLINE + 3 - time.monotonic()))
        for sock in tricklers.socks:
            sock.settimeout(10)
            answer = frames.receive(sock, frames.MAX_ANSWER)
            assert "deadline of 10 s passed" in answer["error"], answer
    finally:
        tricklers.close()


def test_a_stuck_agent_costs_a_del_its_deadline_and_fails_an_add_with_code_11(
    net: AgentNetwork, pods: PodNamespaces, tmp_path: Path
) -> None:
    """An agent that listens but never answers (stopped): DEL gives up on it after
    its deadline and runs in-process; ADD fails with code 11 (try again) and
    leaves nothing; once the agent runs again it does not run the ADD it was sent."""
    pod = wired(net, pods, "x", "a")
    assert net.agent.proc is not None
    net.agent.proc.send_signal(signal.SIGSTOP)
    try:
        netns = pods.new()
        config = tmp_path / "add.json"
        config.write_text(json.dumps(net.config()))
        with config.open("rb") as stdin:
            adding = subprocess.Popen(
                [str(net.network.bin_dir / "sluice")],
                env={
                    "CNI_COMMAND": "ADD",
                    "CNI_CONTAINERID": "stuck-add",
                    "CNI_NETNS": netns,
                    "CNI_IFNAME": "eth0",
                    "CNI_PATH": str(net.network.bin_dir),
                    "CNI_ARGS": k8s_args("x", "stuck"),
                },
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        started = time.monotonic()
        run = timed_delete(net, pod)
        took = time.monotonic() - started
        assert run.rc == 0, run.stdout + run.stderr
        assert took < 10.0, f"DEL took {took:.1f} s"
        assert net.network.allocations() == {}, "the in-process DEL released the address"
        out, _ = adding.communicate(timeout=150)  # its deadline (90 s), and a margin
        answer = json.loads(out)
        assert adding.returncode != 0 and answer["code"] == 11, answer
    finally:
        net.agent.proc.send_signal(signal.SIGCONT)
    assert net.ask({"op": "status"})["ready"]
    assert "gave up before its request ran" in net.agent.log()
    assert net.network.veths() == [] and net.network.allocations() == {}
    assert [e for e in net.endpoints() if e["containerID"] == "stuck-add"] == []


def test_two_agents_started_at_once_for_one_network_one_serves_the_other_refuses(
    tmp_path: Path, bin_dir: Path
) -> None:
    made = AgentNetwork.create(tmp_path, bin_dir)
    logs = [tmp_path / f"agent-{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen(
            [SLUICECTL, "agent", "--conf", str(made.conflist)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        for log in logs
    ]
    try:
        (refused,) = eventually(
            lambda: next((i,) for i, p in enumerate(procs) if p.poll() is not None),
            "one of the agents to exit",
            timeout=120,
            retry_on=(StopIteration,),
        )
        serving = procs[1 - refused]
        assert procs[refused].returncode == 1
        assert "already serves" in logs[refused].read_text(), logs[refused].read_text()
        # It refused before touching anything: no endpoint adopted, no state written.
        assert "adopted" not in logs[refused].read_text(), logs[refused].read_text()
        eventually(
            lambda: made.ask({"op": "status"}, timeout=5)["ready"],
            "the agent serving",
            timeout=120,
            retry_on=(AgentUnavailable,),
        )
        assert serving.poll() is None, logs[1 - refused].read_text()
        # Started after it, a third agent refuses too, and the socket stays the first's.
        inode = os.stat(made.socket).st_ino
        third = subprocess.run(
            [SLUICECTL, "agent", "--conf", str(made.conflist)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert third.returncode == 1 and "already serves" in third.stderr, third.stderr
        assert os.stat(made.socket).st_ino == inode
        assert made.ask({"op": "status"})["ready"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        made.network.cleanup()


def http_status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_healthz_and_readyz(tmp_path: Path, bin_dir: Path) -> None:
    """/healthz answers while the agent serves; /readyz only once every watched kind
    has synced: never, here, with an API server that does not answer."""
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    for extra, ready in (((), True), (("--kubeconfig", str(kubeconfig)), False)):
        port = free_port()
        workdir = tmp_path / f"ready-{ready}"
        workdir.mkdir()
        made = AgentNetwork.create(workdir, bin_dir)
        made.agent.extra = ("--metrics-address", f"127.0.0.1:{port}", *extra)
        try:
            if ready:
                made.start()
            else:
                made.agent.start(made.socket, wait_ready=False)
            base = f"http://127.0.0.1:{port}"
            healthz = eventually(
                lambda url=f"{base}/healthz": http_status(url), "healthz", retry_on=(OSError,)
            )
            assert healthz == (200, "ok\n")
            code, body = http_status(f"{base}/readyz")
            if ready:
                assert (code, body) == (200, "ok\n")
            else:
                assert code == 503 and "not synced yet: namespaces, pods" in body, body
            assert http_status(f"{base}/metrics")[0] == 200
            assert http_status(f"{base}/nope")[0] == 404
        finally:
            made.cleanup()
