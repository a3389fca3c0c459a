"""The NetworkPolicy matrix on a real cluster: namespaces labelled ``ns=<label>`` with
pods labelled ``pod=<name>``, each serving TCP and UDP on 80 and 81 (container ports
named serve-80-tcp, serve-81-tcp, serve-80-udp, serve-81-udp) behind a ClusterIP
Service of its own, as in Kubernetes' NetworkPolicy e2e suite.

The pods are real Kubernetes pods wired by sluice (they only sleep); their servers
and probes run in the pods' network namespaces from the node (``nsenter``), with the
system Python: the servers (``netprobe.py serve``) count at the receiver what reached
them from which address, the probes (``matrix_probe.py``) go to pod addresses or to
the Services' ClusterIPs, so kube-proxy's DNAT is on the path as in the e2e suite.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.cache import AGNHOST_IMAGE
from tests.harness.cluster import Cluster
from tests.harness.waiting import eventually

SUPPORT = Path(__file__).resolve().parent
NETPROBE = str(SUPPORT / "netprobe.py")
MATRIX_PROBE = str(SUPPORT / "matrix_probe.py")
PYTHON = "/usr/bin/python3"
SERVED = ((80, "tcp"), (81, "tcp"), (80, "udp"), (81, "udp"))
PROTOS = ("tcp", "udp")

Matrix = dict[tuple[str, str], bool]  # (from, to) -> reached


def pod_manifest(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    ports = [
        {"name": f"serve-{port}-{proto}", "containerPort": port, "protocol": proto.upper()}
        for port, proto in SERVED
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": AGNHOST_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["pause"],
                    "ports": ports,
                }
            ],
        },
    }


def service_manifest(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"s-{name}", "namespace": namespace},
        "spec": {
            "selector": {"pod": name},
            "ports": [
                {
                    "name": f"p{port}-{proto}",
                    "port": port,
                    "targetPort": port,
                    "protocol": proto.upper(),
                }
                for port, proto in SERVED
            ],
        },
    }


def policy_manifest(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@dataclass
class KubePod:
    namespace: str  # the namespace's real name
    label: str  # its ns label: the x of x/a
    name: str
    ip: str = ""
    cluster_ip: str = ""
    netns: str = ""  # /proc/<pid>/ns/net of its sandbox
    server: subprocess.Popen[str] | None = None

    @property
    def key(self) -> str:
        return f"{self.label}/{self.name}"

    def serve(self) -> None:
        ports = {proto: ",".join(str(p) for p, pr in SERVED if pr == proto) for proto in PROTOS}
        self.server = subprocess.Popen(
            ["nsenter", f"--net={self.netns}", PYTHON, NETPROBE, "serve",
             "--tcp", ports["tcp"], "--udp", ports["udp"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.server.stdout is not None
        line = self.server.stdout.readline().strip()
        assert line == "ready", f"the server in {self.key} said {line!r}"

    def received(self) -> dict[tuple[str, int, str], int]:
        """What reached this pod's servers so far: (proto, port, source) -> count."""
        assert self.server is not None and self.server.stdin and self.server.stdout
        self.server.stdin.write("sources\n")
        self.server.stdin.flush()
        listed = json.loads(self.server.stdout.readline())
        return {(proto, port, source): n for proto, port, source, n in listed}

    def stop_serving(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()

    def reaches(self, targets: list[tuple[str, int, str]], timeout: float) -> list[bool]:
        proc = subprocess.run(
            ["nsenter", f"--net={self.netns}", PYTHON, MATRIX_PROBE, json.dumps(targets),
             str(timeout)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [bool(x) for x in json.loads(proc.stdout)]


@dataclass
class KubeMatrix:
    cluster: Cluster
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    namespaces: dict[str, str] = field(default_factory=dict)  # label -> real name
    pods: dict[str, KubePod] = field(default_factory=dict)  # "x/a" -> pod
    # "x/a" -> the node it must run on (spec.nodeName); the scheduler places the others.
    placement: dict[str, str] = field(default_factory=dict)

    # -- objects ------------------------------------------------------------------------

    def apply(self, *objects: dict[str, Any]) -> None:
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.cluster.kubectl("apply", "-f", "-", stdin=manifest)

    def delete(self, *objects: dict[str, Any]) -> None:
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.cluster.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifest)

    def namespace(self, label: str) -> str:
        """The real name of the namespace labelled ``ns=<label>``, created on first use."""
        if label not in self.namespaces:
            name = f"{label}-{self.suffix}"
            self.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": name, "labels": {"ns": label}},
                }
            )
            self.namespaces[label] = name
        return self.namespaces[label]

    def policy(self, label: str, name: str, **spec: Any) -> dict[str, Any]:
        return policy_manifest(self.namespace(label), name, **spec)

    def add_pods(self, keys: Iterable[str]) -> list[KubePod]:
        """Pods ``"x/a"`` (labelled pod=a, in the namespace labelled ns=x) with their
        Services, running and serving."""
        pods = []
        for key in keys:
            label, name = key.split("/")
            pod = KubePod(self.namespace(label), label, name)
            pods.append(pod)
        manifests = [pod_manifest(p.namespace, p.name, {"pod": p.name}) for p in pods]
        for pod, manifest in zip(pods, manifests, strict=True):
            if pod.key in self.placement:
                manifest["spec"]["nodeName"] = self.placement[pod.key]
        self.apply(
            *manifests,
            *(service_manifest(p.namespace, p.name) for p in pods),
        )
        for pod in pods:
            self.cluster.kubectl(
                "wait", "-n", pod.namespace, "--for=condition=Ready", "--timeout=120s",
                f"pod/{pod.name}", timeout=130,
            )  # fmt: skip
            found = self.cluster.kubectl_json("get", "pod", "-n", pod.namespace, pod.name)
            pod.ip = found["status"]["podIP"]
            service = self.cluster.kubectl_json(
                "get", "service", "-n", pod.namespace, f"s-{pod.name}"
            )
            pod.cluster_ip = service["spec"]["clusterIP"]
            pod.netns = self._netns(pod)
            pod.serve()
            self.pods[pod.key] = pod
        for pod in pods:
            self._wait_service(pod)
        return pods

    def remove_pods(self, keys: Iterable[str]) -> None:
        """Delete pods (and their Services), waiting until they are gone."""
        for key in keys:
            pod = self.pods.pop(key)
            pod.stop_serving()
            self.cluster.kubectl(
                "delete", "-n", pod.namespace, f"pod/{pod.name}", f"service/s-{pod.name}",
                "--ignore-not-found", "--wait=true", timeout=120,
            )  # fmt: skip

    def remove_namespace(self, label: str) -> None:
        """Delete a namespace with its pods, waiting until it is gone."""
        name = self.namespaces.pop(label)
        for key in [k for k, pod in self.pods.items() if pod.namespace == name]:
            self.pods.pop(key).stop_serving()
        self.cluster.kubectl("delete", "namespace", name, "--wait=true", timeout=180)

    def relabel(self, key: str, **labels: str | None) -> None:
        pod = self.pods[key]
        self.cluster.kubectl(
            "label", "pod", "-n", pod.namespace, pod.name, "--overwrite",
            *(f"{k}={v}" if v is not None else f"{k}-" for k, v in labels.items()),
        )  # fmt: skip

    def _netns(self, pod: KubePod) -> str:
        containerd = self.cluster.containerd
        ids = containerd.crictl(
            "pods", "--namespace", pod.namespace, "--name", pod.name, "--state", "ready", "-q"
        ).stdout.split()
        assert len(ids) == 1, f"{pod.key}: sandboxes {ids}"
        info = containerd.crictl_json("inspectp", ids[0])
        return f"/proc/{info['info']['pid']}/ns/net"

    def _wait_service(self, pod: KubePod) -> None:
        """Until kube-proxy forwards the pod's ClusterIP (probed from the node)."""

        def forwarded() -> bool:
            proc = subprocess.run(
                [PYTHON, MATRIX_PROBE, json.dumps([[pod.cluster_ip, 80, "tcp"]]), "1"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            return proc.stdout.strip() == "[true]"

        eventually(forwarded, f"kube-proxy forwarding {pod.cluster_ip} to {pod.key}", 60)

    # -- probes ------------------------------------------------------------------------------

    def probe(
        self,
        sources: Iterable[str],
        targets: Iterable[str],
        port: int,
        protocol: str,
        via_cluster_ip: bool = False,
        timeout: float = 1.0,
    ) -> Matrix:
        """Who reaches whom on one port: {(from, to): reached}."""
        sources, targets = list(sources), list(targets)
        addresses = [
            (self.pods[t].cluster_ip if via_cluster_ip else self.pods[t].ip, port, protocol)
            for t in targets
        ]
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            results = dict(
                zip(
                    sources,
                    pool.map(lambda s: self.pods[s].reaches(addresses, timeout), sources),
                    strict=True,
                )
            )
        return {(s, t): ok for s in sources for t, ok in zip(targets, results[s], strict=True)}

    def received_from(self, target: str, source: str) -> dict[tuple[str, int], int]:
        """What reached ``target``'s servers from ``source``'s address: (proto, port) -> n."""
        address = self.pods[source].ip
        return {
            (proto, port): n
            for (proto, port, src), n in self.pods[target].received().items()
            if src == address
        }

    # -- the end ---------------------------------------------------------------------------

    def destroy(self) -> None:
        for pod in self.pods.values():
            pod.stop_serving()
        for name in self.namespaces.values():
            self.cluster.kubectl(
                "delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=180
            )


@contextlib.contextmanager
def applied_policies(matrix: KubeMatrix) -> Iterator[Callable[..., None]]:
    """``apply(*documents)`` for one test; what it applied is deleted afterwards."""
    applied: list[dict[str, Any]] = []

    def apply(*documents: dict[str, Any]) -> None:
        applied.extend(documents)
        matrix.apply(*documents)

    try:
        yield apply
    finally:
        if applied:
            matrix.delete(*applied)
