"""The node agent for tests: a network in "policy": "enforce" served by a real
``sluicectl agent`` process, pods wired through it, servers in them, and
probes of who reaches whom with real packets."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cni.plugin.client import AgentUnavailable, call
from tests.harness.cni_run import (
    SLUICECTL,
    TEST_NETWORK_PREFIX,
    Network,
    PodNamespaces,
    in_netns,
)

SUPPORT = Path(__file__).resolve().parent
NETPROBE = str(SUPPORT / "netprobe.py")
MATRIX_PROBE = str(SUPPORT / "matrix_probe.py")
PYTHON = "/usr/bin/python3"
START_TIMEOUT = 120.0  # the first agent of a session may compile the datapath


def k8s_args(namespace: str, name: str) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"


class AgentProcess:
    """``sluicectl agent --conf FILE`` running until stopped."""

    def __init__(
        self, conflist: Path, log: Path, *extra: str, wrapper: tuple[str, ...] = ()
    ) -> None:
        self.conflist = conflist
        self.log_path = log
        self.extra = extra
        self.wrapper = wrapper  # e.g. ("nsenter", "--net=/run/netns/N"): a node of its own
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        """Start the process without waiting for it to get ready."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*self.wrapper, SLUICECTL, "agent", "--conf", str(self.conflist), *self.extra],
            stdout=log,
            stderr=log,
        )
        log.close()

    def start(self, socket_path: str, wait_ready: bool = True) -> None:
        """Start and wait until the agent answers ready (or, without ``wait_ready``,
        until it answers at all)."""
        self.launch()
        self.wait_ready(socket_path, wait_ready)

    def wait_ready(self, socket_path: str, ready: bool = True) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                answer = call(socket_path, {"v": 1, "op": "status"}, timeout=5)
                if answer.get("ready") or not ready:
                    return
            except AgentUnavailable:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited ({self.proc.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not get ready:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class AgentNetwork:
    """A network whose policy is enforced, with its agent."""

    network: Network
    workdir: Path
    agent: AgentProcess = field(init=False)

    def __post_init__(self) -> None:
        self.socket = str(self.workdir / "run" / "agent.sock")
        self.conflist = self.workdir / "net.conflist"
        plugin = {k: v for k, v in self.config().items() if k not in ("name", "cniVersion")}
        self.conflist.write_text(
            json.dumps({"cniVersion": "1.1.0", "name": self.network.name, "plugins": [plugin]})
        )
        self.agent = AgentProcess(self.conflist, self.workdir / "agent.log")

    @classmethod
    def create(cls, workdir: Path, bin_dir: Path) -> AgentNetwork:
        network = Network(
            name=f"{TEST_NETWORK_PREFIX}{uuid.uuid4().hex[:7]}",
            subnet=f"10.{random.randint(200, 239)}.{random.randint(0, 255)}.0/24",
            state_dir=workdir / "state",
            bin_dir=bin_dir,
        )
        return cls(network, workdir)

    def config(self, **overrides: Any) -> dict[str, Any]:
        return self.network.config(policy="enforce", agentSocket=self.socket, **overrides)

    def start(self) -> None:
        self.agent.start(self.socket)

    def stop(self) -> None:
        self.agent.stop()

    def ask(self, request: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        return call(self.socket, {"v": 1, **request}, timeout=timeout)

    def apply(self, *documents: dict[str, Any]) -> dict[str, Any]:
        answer = self.ask({"op": "apply", "manifest": yaml.safe_dump_all(documents)})
        assert "error" not in answer, answer
        return answer

    def delete_objects(self, *documents: dict[str, Any]) -> dict[str, Any]:
        answer = self.ask({"op": "delete", "manifest": yaml.safe_dump_all(documents)})
        assert "error" not in answer, answer
        return answer

    def endpoints(self) -> list[dict[str, Any]]:
        return list(self.ask({"op": "get", "what": "endpoints"})["endpoints"])

    def add(self, netns: str, cid: str, namespace: str, name: str) -> dict[str, Any]:
        return self.network.add(
            netns, cid, config=self.config(), cni_args=k8s_args(namespace, name)
        )

    def delete(self, netns: str, cid: str, namespace: str, name: str) -> None:
        self.network.delete(
            netns, cid, config=self.config(), cni_args=k8s_args(namespace, name)
        ).ok()

    def cleanup(self) -> None:
        self.stop()
        self.network.cleanup()


# -- objects -------------------------------------------------------------------------------


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


SERVED = ((80, "tcp"), (81, "tcp"), (80, "udp"), (81, "udp"))


def pod_object(ns: str, name: str, **labels: str) -> dict[str, Any]:
    ports = [
        {"name": f"serve-{port}-{proto}", "containerPort": port, "protocol": proto.upper()}
        for port, proto in SERVED
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
    }


def policy(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


# -- pods and probes ---------------------------------------------------------------------------


@dataclass
class PolicyPod:
    namespace: str
    name: str
    cid: str
    netns: str
    ip: str
    server: subprocess.Popen[str] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def serve(self) -> None:
        tcp = ",".join(str(p) for p, proto in SERVED if proto == "tcp")
        udp = ",".join(str(p) for p, proto in SERVED if proto == "udp")
        command = ["ip", "netns", "exec", Path(self.netns).name, PYTHON, NETPROBE, "serve"]
        self.server = subprocess.Popen(
            [*command, "--tcp", tcp, "--udp", udp],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.server.stdout is not None
        assert self.server.stdout.readline().strip() == "ready"

    def stop_serving(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()

    def reaches(self, targets: list[tuple[str, int, str]], timeout: float = 1.0) -> list[bool]:
        proc = in_netns(
            self.netns, PYTHON, MATRIX_PROBE, json.dumps(targets), str(timeout), timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return [bool(x) for x in json.loads(proc.stdout)]


Matrix = dict[tuple[str, str], bool]


@dataclass
class PolicyCluster:
    """Namespaces x, y, z with pods a, b, c each, serving TCP and UDP on 80 and 81."""

    net: AgentNetwork
    pods_ns: PodNamespaces
    pods: dict[str, PolicyPod] = field(default_factory=dict)

    NAMESPACES = ("x", "y", "z")
    NAMES = ("a", "b", "c")

    def base_objects(self) -> list[dict[str, Any]]:
        objects = [namespace(ns, ns=ns) for ns in self.NAMESPACES]
        objects += [pod_object(ns, n, pod=n) for ns in self.NAMESPACES for n in self.NAMES]
        return objects

    def create(self) -> None:
        self.net.apply(*self.base_objects())
        for ns in self.NAMESPACES:
            for name in self.NAMES:
                netns = self.pods_ns.new()
                cid = f"{ns}-{name}-{uuid.uuid4().hex[:6]}"
                result = self.net.add(netns, cid, ns, name)
                ip = result["ips"][0]["address"].split("/")[0]
                pod = PolicyPod(ns, name, cid, netns, ip)
                pod.serve()
                self.pods[pod.key] = pod

    def add_pod(self, ns: str, name: str, **labels: str) -> PolicyPod:
        """A pod that appears later: its object applied, then wired and serving."""
        self.net.apply(namespace(ns, ns=ns), pod_object(ns, name, pod=name, **labels))
        netns = self.pods_ns.new()
        cid = f"{ns}-{name}-{uuid.uuid4().hex[:6]}"
        result = self.net.add(netns, cid, ns, name)
        pod = PolicyPod(ns, name, cid, netns, result["ips"][0]["address"].split("/")[0])
        pod.serve()
        self.pods[pod.key] = pod
        return pod

    def remove_pod(self, key: str) -> None:
        """Unwire a pod added later and forget its object."""
        pod = self.pods.pop(key)
        pod.stop_serving()
        self.net.delete(pod.netns, pod.cid, pod.namespace, pod.name)
        self.pods_ns.remove(pod.netns)
        self.net.delete_objects(pod_object(pod.namespace, pod.name))

    def destroy(self) -> None:
        for pod in self.pods.values():
            pod.stop_serving()
            self.net.delete(pod.netns, pod.cid, pod.namespace, pod.name)

    def probe(
        self,
        port: int = 80,
        protocol: str = "tcp",
        sources: Iterable[str] | None = None,
        via: dict[str, str] | None = None,
        timeout: float = 1.0,
    ) -> Matrix:
        """Who reaches whom on one port: {(from, to): reached}; by pod address, or by the
        addresses in ``via`` (a Service's ClusterIP for each pod)."""
        keys = list(self.pods)
        sources = list(sources or keys)
        targets = [((via or {}).get(k) or self.pods[k].ip, port, protocol) for k in keys]
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            results = dict(
                zip(
                    sources,
                    pool.map(lambda s: self.pods[s].reaches(targets, timeout), sources),
                    strict=True,
                )
            )
        return {(s, t): ok for s in sources for t, ok in zip(keys, results[s], strict=True)}


def expect(cluster: PolicyCluster, allowed: Any) -> Matrix:
    """The full matrix with ``allowed(source, target)`` for each pair (self always)."""
    return {(s, t): s == t or bool(allowed(s, t)) for s in cluster.pods for t in cluster.pods}


def differences(got: Matrix, wanted: Matrix) -> list[str]:
    return [
        f"{s} -> {t}: {'reached' if got[(s, t)] else 'blocked'}, expected "
        f"{'reached' if wanted[(s, t)] else 'blocked'}"
        for (s, t) in sorted(wanted)
        if (s, t) in got and got[(s, t)] != wanted[(s, t)]
    ]


def service(ns: str, name: str, cluster_ip: str, **selector: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "clusterIP": cluster_ip,
            "selector": selector,
            "ports": [{"port": 80, "targetPort": 80, "protocol": "TCP"}],
        },
    }
