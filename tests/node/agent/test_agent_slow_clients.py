"""The agent's HTTP ports under slow clients from a pod.

A pod opens TRICKLERS connections to the agent's port on the node's address and
sends each request one byte every TRICKLE_GAP seconds, never finishing it,
reopening whatever the agent closes. Meanwhile the node asks /healthz and
/readyz every PROBE_INTERVAL seconds with the kubelet's default timeout of one
second. Every probe must be answered, the agent must not exit, and an ADD must
still work. Before the listener bounded the whole of each request and the
connections of each source, 18 such connections held its two workers and its
backlog, and every probe failed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.harness.agent import AgentNetwork
from tests.harness.cni_run import PodNamespaces
from tests.harness.probes import PYTHON, node_address

pytestmark = pytest.mark.slow

TRICKLE = str(Path(__file__).resolve().parents[2] / "harness" / "trickle.py")
MANIFEST = Path(__file__).resolve().parents[3] / "conf" / "sluice.yaml"
TRICKLE_SECONDS = 60.0  # the attack on the shared port, as the report has it
APART_SECONDS = 20.0  # the attack beside a health port of its own (its own threads)
TRICKLERS = 64
TRICKLE_GAP = 5.0  # seconds between two bytes of one connection
PROBE_INTERVAL = 1.0
PROBE_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds
POD_GATEWAY = "169.254.1.1"  # the node as a pod's default route has it (docs/cni.md)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def answers(url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """The kubelet's httpGet: success is a status from 200 to 399 within the timeout."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            return 200 <= response.status < 400
    except (OSError, urllib.error.HTTPError):
        return False


@dataclass
class Attack:
    answered: int
    failed: int
    trickled: dict[str, float]  # trickle.py's report


def trickle_while_probing(
    net: AgentNetwork, netns: str, target: tuple[str, int], probe_urls: list[str], seconds: float
) -> Attack:
    """Trickle from ``netns`` to ``target`` for ``seconds`` while the node probes."""
    trickler = subprocess.Popen(
        ["ip", "netns", "exec", Path(netns).name, PYTHON, TRICKLE, target[0], str(target[1]),
         str(TRICKLERS), str(TRICKLE_GAP), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    answered = failed = 0
    try:
        time.sleep(2 * TRICKLE_GAP)  # every connection is open and has sent bytes
        end = time.monotonic() + seconds - 2 * TRICKLE_GAP - PROBE_INTERVAL
        while time.monotonic() < end:
            started = time.monotonic()
            for url in probe_urls:
                if answers(url):
                    answered += 1
                else:
                    failed += 1
            assert net.agent.proc is not None
            assert net.agent.proc.poll() is None, f"the agent exited:\n{net.agent.log()}"
            time.sleep(max(0.0, PROBE_INTERVAL - (time.monotonic() - started)))
        out, err = trickler.communicate(timeout=seconds + 30)
    finally:
        if trickler.poll() is None:
            trickler.kill()
            trickler.wait()
    assert trickler.returncode == 0, err
    return Attack(answered, failed, json.loads(out))


def can_connect(netns: str, address: str, port: int) -> bool:
    """A TCP connect from inside ``netns`` succeeds within two seconds."""
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({address!r}, {port}), timeout=2).close()\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    run = subprocess.run(
        ["ip", "netns", "exec", Path(netns).name, PYTHON, "-c", script],
        capture_output=True,
        timeout=20,
        check=False,
    )
    return run.returncode == 0


@contextlib.contextmanager
def agent_and_a_pod(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces, *extra: str
) -> Iterator[tuple[AgentNetwork, str]]:
    """The agent serving with ``extra`` arguments, and a pod it wired (its netns)."""
    net = AgentNetwork.create(tmp_path, bin_dir)
    net.agent.extra = extra
    pod = pods.new()
    cid = f"pod-{uuid.uuid4().hex[:6]}"
    try:
        net.start()
        net.add(pod, cid, "x", cid)
        yield net, pod
    finally:
        net.delete(pod, cid, "x", cid)
        net.cleanup()


def add_and_delete(net: AgentNetwork, pods: PodNamespaces) -> None:
    netns = pods.new()
    cid = f"during-{uuid.uuid4().hex[:8]}"
    assert net.add(netns, cid, "x", cid)["ips"]
    net.delete(netns, cid, "x", cid)
    pods.remove(netns)


def test_probes_answer_while_a_pod_trickles_into_the_shared_port(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces
) -> None:
    """One listener for /metrics and the probes, on every address of the node (what
    the manifest shipped before): a pod's slow clients cannot starve the probes."""
    port = free_port()
    shared = ("--metrics-address", f"0.0.0.0:{port}")
    with agent_and_a_pod(tmp_path, bin_dir, pods, *shared) as (net, attacker):
        probes = [f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"]
        attack = trickle_while_probing(
            net, attacker, (node_address(), port), probes, TRICKLE_SECONDS
        )
        print(f"\nshared port, {TRICKLE_SECONDS:.0f} s: {attack}")
        assert attack.trickled["opened"] >= TRICKLERS, f"the pod did not reach the port: {attack}"
        assert attack.failed == 0, f"probes failed under slow clients: {attack}"
        assert attack.answered > 0
        add_and_delete(net, pods)
        assert net.agent.proc is not None and net.agent.proc.poll() is None


def test_probes_apart_answer_while_a_pod_trickles_into_the_metrics_port(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces
) -> None:
    """Probes on a loopback listener of their own (as the manifest serves them): no
    pod reaches it, and slow clients on the metrics port leave it alone."""
    metrics_port, health_port = free_port(), free_port()
    addresses = (
        "--metrics-address", f"0.0.0.0:{metrics_port}",
        "--health-address", f"127.0.0.1:{health_port}",
    )  # fmt: skip
    with agent_and_a_pod(tmp_path, bin_dir, pods, *addresses) as (net, attacker):
        for address in (node_address(), POD_GATEWAY):
            assert not can_connect(attacker, address, health_port), address
        assert can_connect(attacker, node_address(), metrics_port)  # the premise
        base = f"http://127.0.0.1:{health_port}"
        attack = trickle_while_probing(
            net, attacker, (node_address(), metrics_port),
            [f"{base}/healthz", f"{base}/readyz"], APART_SECONDS,
        )  # fmt: skip
        print(f"\nhealth port apart, {APART_SECONDS:.0f} s: {attack}")
        assert attack.trickled["opened"] >= TRICKLERS, attack
        assert attack.failed == 0, f"probes failed under slow clients: {attack}"
        assert answers(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert not answers(f"{base}/metrics")  # the probes' listener serves only them
        add_and_delete(net, pods)


def manifest_address(key: str) -> str:
    """The host part of a HOST:PORT in the manifest's ConfigMap."""
    for document in yaml.safe_load_all(MANIFEST.read_text()):
        if document and document.get("kind") == "ConfigMap":
            value = document["data"].get(key)
            if value is not None:
                return str(value).rpartition(":")[0]
    raise AssertionError(f"no {key} in the ConfigMap of {MANIFEST}")


def test_no_pod_reaches_the_manifests_ports(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces
) -> None:
    """The manifest's addresses for /metrics and the probes (on ports of the test's
    own): the node reaches both, a pod neither, whatever node address it tries."""
    metrics_port, health_port = free_port(), free_port()
    metrics_host = manifest_address("SLUICE_METRICS_ADDRESS")
    health_host = manifest_address("SLUICE_HEALTH_ADDRESS")
    addresses = (
        "--metrics-address", f"{metrics_host}:{metrics_port}",
        "--health-address", f"{health_host}:{health_port}",
    )  # fmt: skip
    with (
        agent_and_a_pod(tmp_path, bin_dir, pods, *addresses) as (_, pod),
        socket.create_server(("0.0.0.0", 0)) as open_port,
    ):
        # The premise: the pod reaches a port open on every address of the node.
        assert can_connect(pod, node_address(), open_port.getsockname()[1])
        assert answers(f"http://127.0.0.1:{health_port}/healthz")
        assert answers(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        for address in (node_address(), POD_GATEWAY, "127.0.0.1"):
            for port in (metrics_port, health_port):
                assert not can_connect(pod, address, port), (address, port)
