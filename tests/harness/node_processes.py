"""Starting and stopping a test cluster node's processes, the same way on every node.

The single-node ``Cluster`` and each node of a ``MultiNodeCluster`` start containerd,
``sluicectl install``, the node agent, the kubelet and kube-proxy through one
``NodeProcesses``, and take them down through it. Each daemon is recorded in the
node's entry of the state file before anything waits on it, so a ``down`` (also
from a later process) finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import components, host
from tests.harness.cache import AGNHOST_IMAGE, PAUSE_IMAGE, K8sCache
from tests.harness.cluster_state import ClusterError
from tests.harness.components import ClusterLayout
from tests.harness.containerd import CRI_NAMESPACE, PrivateContainerd
from tests.harness.node_layout import LOOPBACK_PLUGIN, NodeLayout
from tests.harness.processes import (
    Daemons,
    ProcessRecord,
    is_alive,
    log_tail,
    process_start_time,
)

# Polls a condition until it holds or the timeout (seconds) passes, failing early when
# one of the cluster's daemons exited.
Wait = Callable[[Callable[[], bool], str, float], None]
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
Step = tuple[str, Callable[[], object]]


@dataclass
class NodeProcesses:
    layout: NodeLayout
    records: dict[str, ProcessRecord]  # the node's processes in the state file
    save: Callable[[], None]  # writes the state file
    daemons: Daemons
    wait: Wait
    cache: K8sCache

    def start(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = self.daemons.start(name, self.layout.command(argv), self.layout.log_path(name))
        self.records[name] = record
        self.save()
        return record

    def stop(self, name: str) -> None:
        """Stop ``name``, keeping its record for ``leftovers`` to check."""
        record = self.records.get(name)
        if record is not None:
            self.daemons.stop(record)

    def withdraw(self, name: str, crash: bool = False) -> None:
        """Stop ``name`` and forget it: SIGTERM, or SIGKILL as a crash would."""
        record = self.records.pop(name, None)
        self.save()
        if record is None:
            return
        if crash:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        self.daemons.stop(record)

    def start_containerd(self, containerd: PrivateContainerd) -> None:
        """Start the node's containerd and import the images its pods use."""
        containerd.start()
        assert containerd.pid is not None
        self.records["containerd"] = ProcessRecord(
            "containerd",
            containerd.pid,
            process_start_time(containerd.pid) or 0,
            ["containerd", "--config", str(containerd.config_path)],
            str(containerd.log_path),
        )
        self.save()
        for image in (PAUSE_IMAGE, AGNHOST_IMAGE):
            containerd.import_image(self.cache.image_tar(image), namespace=CRI_NAMESPACE)

    def install_sluice(self, subnet: str, install_args: Sequence[str]) -> None:
        """``sluicectl install`` into the node's CNI directories, with sluice's defaults
        for a test cluster and ``install_args`` after them."""
        layout = self.layout
        layout.cni_bin_dir.mkdir(parents=True, exist_ok=True)
        layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)  # containerd may have made it
        layout.sluice_state_dir.mkdir(parents=True)
        argv = layout.sluice_install_argv(subnet, install_args)
        proc = layout.run(argv)  # in the node: the pod MTU is its uplink's
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        (layout.cni_bin_dir / LOOPBACK_PLUGIN.name).symlink_to(LOOPBACK_PLUGIN)

    def start_agent(
        self, argv: Sequence[str], node_name: str, wait_ready: bool = True
    ) -> ProcessRecord:
        record = self.start("sluice-agent", argv)
        if wait_ready:
            # Ready when the plugin can serve an ADD (with "enforce" that needs the agent).
            what = f"sluicectl status on {node_name} to report the node ready"
            self.wait(self.layout.sluice_ready, what, 120)
        return record

    def start_kubelet(
        self,
        layout: ClusterLayout,
        config: dict[str, object],
        kubectl: Kubectl,
        timeout: float = 60.0,
    ) -> str:
        """Start the kubelet; return the podCIDR its Node got once it registered."""
        layout.kubelet_dir.mkdir()
        host.create_cgroups(layout.cgroup_root)
        config_file = components.write_json(layout.kubelet_dir / "config.json", config)
        self.start("kubelet", components.kubelet_argv(layout, config_file))
        pod_cidr = ""

        def registered() -> bool:
            nonlocal pod_cidr
            pod_cidr = registered_pod_cidr(kubectl, layout.node_name)
            return bool(pod_cidr)

        self.wait(registered, f"node {layout.node_name} registered with a podCIDR", timeout)
        return pod_cidr

    def start_kube_proxy(self, layout: ClusterLayout) -> None:
        config = components.kube_proxy_config(layout)
        config_file = components.write_json(self.layout.directory / "kube-proxy.json", config)
        self.start("kube-proxy", components.kube_proxy_argv(layout, config_file))

    def services_programmed(self) -> bool:
        """kube-proxy wrote the rules of the kubernetes Service in the node's namespace."""
        nat = self.layout.run(["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"])
        return "default/kubernetes:https" in nat.stdout

    # --- down -------------------------------------------------------------------------

    def stop_steps(self, containerd: Callable[[], PrivateContainerd | None]) -> list[Step]:
        """Stopping the node's daemons, the pods removed through CRI first so that the
        CNI plugin sees every DEL. ``containerd`` gives a handle, if the node has one."""
        return [
            ("stop kubelet", lambda: self.stop("kubelet")),
            ("remove pods through CRI", lambda: self.remove_pods(containerd)),
            ("stop the sluice agent", lambda: self.stop("sluice-agent")),
            ("stop kube-proxy", lambda: self.stop("kube-proxy")),
            ("stop containerd", lambda: self.stop_containerd(containerd())),
        ]

    def remove_pods(self, containerd: Callable[[], PrivateContainerd | None]) -> None:
        record = self.records.get("containerd")
        if record is None or not is_alive(record):
            return
        handle = containerd()
        if handle is None:
            return
        for pod in handle.crictl("pods", "-q", check=False, timeout=30).stdout.split():
            handle.remove_pod(pod, check=False)

    def stop_containerd(self, containerd: PrivateContainerd | None) -> None:
        """Stop containerd, then close ``containerd``: shims, mounts, its directory and
        cgroups."""
        record = self.records.get("containerd")
        if record is not None and (containerd is None or not containerd.running):
            self.daemons.stop(record)  # started by another handle or process
        if containerd is not None:
            containerd.close()

    def keep_logs(self, dest: Path) -> None:
        """Copy the node's logs (containerd's too) into ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        for log in self.layout.logs_dir.glob("*.log"):
            shutil.copy2(log, dest / log.name)
        containerd_log = self.layout.containerd_base / "containerd.log"
        if containerd_log.exists():
            shutil.copy2(containerd_log, dest / "containerd.log")


def registered_pod_cidr(kubectl: Kubectl, node_name: str) -> str:
    """The podCIDR of Node ``node_name``: empty until it is registered and has one."""
    proc = kubectl("get", "node", node_name, "-o", "json", check=False)
    if proc.returncode != 0:
        return ""
    return json.loads(proc.stdout).get("spec", {}).get("podCIDR") or ""


def api_has(kubectl: Kubectl, *what: str) -> Callable[[], bool]:
    """Whether ``kubectl get <what>`` finds it, as a condition to wait for."""
    return lambda: kubectl("get", *what, check=False).returncode == 0


def schedulable(node: dict[str, Any]) -> bool:
    """A Node object that is Ready and has no NoSchedule taint (pods may land on it)."""
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("effect") == "NoSchedule" for t in taints)


def wait_serving(wait: Wait, kubectl: Kubectl, nodes: Mapping[str, NodeProcesses]) -> None:
    """Once the Nodes are schedulable: wait until the default namespace takes pods and
    kube-proxy programmed the Services on every node."""
    for what in (
        ("serviceaccount", "default", "-n", "default"),
        ("configmap", "kube-root-ca.crt", "-n", "default"),
    ):
        wait(api_has(kubectl, *what), " ".join(what), 60.0)
    for name, node in nodes.items():
        wait(
            node.services_programmed,
            f"kube-proxy on {name} to program the kubernetes Service",
            60.0,
        )


def assert_running(daemons: Daemons, records: Mapping[str, ProcessRecord], where: str = "") -> None:
    """Raise with the tail of its log if one of ``records`` exited."""
    for record in records.values():
        code = daemons.exited(record)
        if code is not None:
            raise ClusterError(
                f"{record.name}{where} exited ({code}); tail of {record.log}:\n"
                f"{log_tail(record.log)}"
            )


def run_steps(steps: Sequence[Step]) -> list[str]:
    """Run every step, also after one failed; return what failed and why."""
    errors = []
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(f"{what}: {exc}")
    return errors
