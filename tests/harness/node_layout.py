"""Where a test cluster's node keeps its files, and the commands made of them.

The single-node ``Cluster`` and each node of a ``MultiNodeCluster`` are laid out
alike: a ``NodeLayout`` names the node's directory (CNI bin and conf dirs, sluice's
conflist, state dir and agent socket, kubeconfigs, logs), its containerd base, its
sluice network, bpffs directory and cgroup root, and the network namespace its
processes run in (none: the host's). ``NodeHandle`` shows a layout as attributes of
either handle, which is what tests reach for.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.cache import PAUSE_IMAGE, K8sCache
from tests.harness.cluster_state import ClusterError
from tests.harness.components import ClusterLayout, Ports
from tests.harness.containerd import PrivateContainerd
from tests.harness.node_network import in_netns

REPO_ROOT = Path(__file__).resolve().parents[2]
SLUICECTL = REPO_ROOT / ".venv" / "bin" / "sluicectl"
LOOPBACK_PLUGIN = Path("/usr/lib/cni/loopback")  # containerd's CRI runs it for `lo`

# Every node's podCIDR is a /24 of the cluster's range, given by the controller-manager.
CLUSTER_CIDR = "10.244.0.0/16"
NODE_CIDR_MASK = 24
SERVICE_CIDR = "10.96.0.0/16"

Argv = Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class NodeLayout:
    directory: Path
    containerd_base: Path  # named sluice-ctrd-*: also its containers' cgroup parent
    network: str  # sluice's network name
    bpf_dir: Path
    cgroup_root: str  # the kubelet's
    netns: str | None = None

    @property
    def cni_bin_dir(self) -> Path:
        return self.directory / "cni" / "bin"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def sluice_conf(self) -> Path:
        return self.cni_conf_dir / "10-sluice.conflist"

    @property
    def sluice_state_dir(self) -> Path:
        return self.directory / "sluice" / "state"

    @property
    def agent_socket(self) -> Path:
        return self.directory / "sluice" / "agent.sock"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    def log_path(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def kubeconfig(self, client: str) -> Path:
        return self.directory / f"{client}.kubeconfig"

    def components(
        self, cache: K8sCache, ports: Ports, node_name: str, node_ip: str
    ) -> ClusterLayout:
        """What the Kubernetes components' flags on this node are made of."""
        return ClusterLayout(
            directory=self.directory,
            cache=cache,
            ports=ports,
            node_name=node_name,
            node_ip=node_ip,
            cluster_cidr=CLUSTER_CIDR,
            node_cidr_mask=NODE_CIDR_MASK,
            service_cidr=SERVICE_CIDR,
            containerd_socket=self.containerd_base / "containerd.sock",
            cgroup_root=self.cgroup_root,
        )

    def containerd(self) -> PrivateContainerd:
        """A handle on the node's containerd (creating one makes its base directory)."""
        return PrivateContainerd(
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            sandbox_image=PAUSE_IMAGE,
            base=self.containerd_base,
            netns=self.netns,
        )

    def sluice_install_argv(self, subnet: str, install_args: Sequence[str]) -> list[str]:
        return [
            str(SLUICECTL),
            "install",
            f"--bin-dir={self.cni_bin_dir}",
            f"--conf-dir={self.cni_conf_dir}",
            f"--conf-name={self.sluice_conf.name}",
            f"--name={self.network}",
            f"--subnet={subnet}",
            f"--cluster-cidr={CLUSTER_CIDR}",
            "--cni-version=1.0.0",  # containerd 1.6's libcni knows results up to 1.0.0
            "--policy=off",
            f"--state-dir={self.sluice_state_dir}",
            f"--bpf-dir={self.bpf_dir}",
            f"--agent-socket={self.agent_socket}",
            *install_args,  # later options win
        ]

    def agent_argv(self, node_name: str) -> list[str]:
        """The node agent serving this node's network and watching the API as it."""
        return [
            str(SLUICECTL),
            "agent",
            "--conf",
            str(self.sluice_conf),
            "--kubeconfig",
            str(self.kubeconfig("sluice-agent")),
            "--node-name",
            node_name,
        ]

    def command(self, argv: Argv) -> list[str]:
        """``argv`` as run in the node's network namespace."""
        strings = [str(a) for a in argv]
        return in_netns(self.netns, strings) if self.netns else strings

    def run(self, argv: Argv, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def sluicectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sluicectl`` with the node's network config (``--conf`` is added)."""
        proc = self.run([str(SLUICECTL), *args, "--conf", str(self.sluice_conf)], timeout=120)
        if check and proc.returncode != 0:
            where = f"in {self.netns}: " if self.netns else ""
            raise ClusterError(
                f"{where}sluicectl {' '.join(args)} exited {proc.returncode}: "
                f"{proc.stdout.strip()} {proc.stderr.strip()}"
            )
        return proc

    def sluice_ready(self) -> bool:
        """`sluicectl status`: an ADD can be served now (with "enforce": the agent is up)."""
        status = self.sluicectl("status", f"--bin-dir={self.cni_bin_dir}", check=False)
        return status.returncode == 0


class NodeHandle:
    """A node's paths and sluicectl as attributes of its handle (``Cluster``,
    ``multinode.Node``), which sets ``layout``."""

    layout: NodeLayout

    @property
    def cni_bin_dir(self) -> Path:
        return self.layout.cni_bin_dir

    @property
    def cni_conf_dir(self) -> Path:
        return self.layout.cni_conf_dir

    @property
    def sluice_conf(self) -> Path:
        return self.layout.sluice_conf

    @property
    def sluice_state_dir(self) -> Path:
        return self.layout.sluice_state_dir

    @property
    def agent_socket(self) -> Path:
        return self.layout.agent_socket

    @property
    def containerd_base(self) -> Path:
        return self.layout.containerd_base

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs_dir

    def log_path(self, component: str) -> Path:
        return self.layout.log_path(component)

    def run(self, argv: Argv, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """A command in the node's network namespace (the host's for a single node)."""
        return self.layout.run(argv, timeout)

    def sluicectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.layout.sluicectl(*args, check=check)

    def sluice_ready(self) -> bool:
        return self.layout.sluice_ready()
