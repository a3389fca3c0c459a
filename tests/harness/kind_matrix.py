"""The NetworkPolicy matrix (``kube_matrix``) on a kind cluster running sluice.

The node containers are Docker containers on this host, so a pod's network
namespace is reachable from here: containerd inside the node names it (a file
under the node's /run/netns), and ``/proc/<node's pid>/root`` leads to it. The
servers and probes run there with the host's Python, as on the harness's
clusters; a Service is probed from a node's own namespace, where its kube-proxy
rules are.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from tests.harness import kind
from tests.harness.kube_matrix import MATRIX_PROBE, PYTHON, KubeMatrix, KubePod
from tests.harness.waiting import eventually


@dataclass
class KindKubectl:
    """The part of ``Cluster`` that the matrix uses (kubectl with a stdin), on kind."""

    name: str

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(kind.kubectl_binary()), "--kubeconfig", str(kind.kubeconfig_path(self.name))]
        proc = subprocess.run(
            [*argv, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise kind.KindFailed(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)


@dataclass
class KindMatrix(KubeMatrix):
    cluster: Any = None  # a KindKubectl
    docker: Any = None  # a docker.DockerClient of the cluster's daemon

    def node_container(self, name: str) -> Any:
        (found,) = [
            c for c in kind.node_containers(self.docker, self.cluster.name) if c.name == name
        ]
        return found

    def _crictl(self, node: Any, *args: str) -> str:
        result = node.exec_run(["crictl", *args])
        output = result.output.decode(errors="replace")
        assert result.exit_code == 0, f"crictl {' '.join(args)} on {node.name}: {output}"
        return str(output)

    def _netns(self, pod: KubePod) -> str:
        found = self.cluster.kubectl_json("get", "pod", "-n", pod.namespace, pod.name)
        node = self.node_container(found["spec"]["nodeName"])
        ids = self._crictl(
            node, "pods", "--namespace", pod.namespace, "--name", pod.name, "--state", "ready", "-q"
        ).split()
        assert len(ids) == 1, f"{pod.key} on {node.name}: sandboxes {ids}"
        info = json.loads(self._crictl(node, "inspectp", ids[0]))["info"]
        (path,) = [
            n["path"] for n in info["runtimeSpec"]["linux"]["namespaces"] if n["type"] == "network"
        ]
        # /var/run is a symbolic link to /run inside the node; under /proc/<pid>/root
        # an absolute link would be resolved against this host's root instead.
        inside = PurePosixPath(path)
        if inside.parts[1:3] == ("var", "run"):
            inside = PurePosixPath("/run", *inside.parts[3:])
        node.reload()
        return f"/proc/{node.attrs['State']['Pid']}/root{inside}"

    def _wait_service(self, pod: KubePod) -> None:
        """Until every node's kube-proxy forwards the pod's ClusterIP."""
        for node in kind.node_containers(self.docker, self.cluster.name):
            netns = f"/proc/{node.attrs['State']['Pid']}/ns/net"

            def forwarded(netns: str = netns) -> bool:
                probe = [PYTHON, MATRIX_PROBE, json.dumps([[pod.cluster_ip, 80, "tcp"]]), "1"]
                proc = subprocess.run(
                    ["nsenter", f"--net={netns}", *probe],
                    capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
                return proc.stdout.strip() == "[true]"

            eventually(forwarded, f"{node.name} forwarding {pod.cluster_ip} to {pod.key}", 120)
