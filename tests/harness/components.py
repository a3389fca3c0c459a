"""Command lines and configuration files of each Kubernetes component.

Pure functions of a ``ClusterLayout`` (addresses, ports, directories): no process is
started here. Every port is the component's usual one moved into ``port_base``'s
thousand (6443 -> 24443 for base 24000), below the NodePort and ephemeral ranges, so
the cluster never collides with a system component.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.harness.cache import K8sCache

DEFAULT_PORT_BASE = 24000
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    base: int = DEFAULT_PORT_BASE

    def _port(self, usual: int) -> int:
        return self.base + usual % 1000

    @property
    def etcd_client(self) -> int:
        return self._port(2379)

    @property
    def etcd_peer(self) -> int:
        return self._port(2380)

    @property
    def apiserver(self) -> int:
        return self._port(6443)

    @property
    def kubelet(self) -> int:
        return self._port(10250)

    @property
    def kubelet_healthz(self) -> int:
        return self._port(10248)

    @property
    def proxy_metrics(self) -> int:
        return self._port(10249)

    @property
    def proxy_healthz(self) -> int:
        return self._port(10256)

    @property
    def controller_manager(self) -> int:
        return self._port(10257)

    @property
    def scheduler(self) -> int:
        return self._port(10259)

    def listeners(self, node_ip: str) -> dict[str, tuple[str, int]]:
        """What listens where: checked to be free before anything starts."""
        loopback = "127.0.0.1"
        return {
            "etcd client": (loopback, self.etcd_client),
            "etcd peer": (loopback, self.etcd_peer),
            "kube-apiserver": (node_ip, self.apiserver),
            "kubelet": (node_ip, self.kubelet),
            "kubelet healthz": (loopback, self.kubelet_healthz),
            "kube-proxy metrics": (loopback, self.proxy_metrics),
            "kube-proxy healthz": (loopback, self.proxy_healthz),
            "kube-controller-manager": (loopback, self.controller_manager),
            "kube-scheduler": (loopback, self.scheduler),
        }


@dataclass(frozen=True)
class ClusterLayout:
    """Everything the components' flags are made of."""

    directory: Path
    cache: K8sCache
    ports: Ports
    node_name: str
    node_ip: str
    cluster_cidr: str  # all pods; the node's podCIDR is its first /24
    node_cidr_mask: int
    service_cidr: str
    containerd_socket: Path
    cgroup_root: str

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def etcd_dir(self) -> Path:
        return self.directory / "etcd"

    @property
    def kubelet_dir(self) -> Path:
        return self.directory / "kubelet"

    @property
    def apiserver_url(self) -> str:
        return f"https://{self.node_ip}:{self.ports.apiserver}"

    def kubeconfig(self, client: str) -> Path:
        return self.directory / f"{client}.kubeconfig"

    def binary(self, name: str) -> Path:
        return self.cache.binary(name)


def etcd_argv(layout: ClusterLayout) -> list[str]:
    client = f"http://127.0.0.1:{layout.ports.etcd_client}"
    peer = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return [
        "etcd",
        "--name=sluice-test",
        f"--data-dir={layout.etcd_dir / 'data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=sluice-test={peer}",
        "--logger=zap",
        "--log-level=warn",
    ]


def apiserver_argv(layout: ClusterLayout) -> list[str]:
    pki = layout.pki_dir
    return [
        str(layout.binary("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{layout.ports.etcd_client}",
        f"--bind-address={layout.node_ip}",
        f"--advertise-address={layout.node_ip}",
        f"--secure-port={layout.ports.apiserver}",
        f"--cert-dir={layout.directory / 'apiserver-certs'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--service-account-key-file={pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki / 'service-account.key'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        f"--service-cluster-ip-range={layout.service_cidr}",
        "--allow-privileged=true",
        # Without it `kubectl exec` dials the node by name, which does not resolve.
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(layout: ClusterLayout, *extra: str) -> list[str]:
    kubeconfig = layout.kubeconfig("kube-controller-manager")
    return [
        str(layout.binary("kube-controller-manager")),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports.controller_manager}",
        f"--cert-dir={layout.directory / 'controller-manager-certs'}",
        # Without these no ServiceAccount token can be made and pods are refused.
        f"--service-account-private-key-file={layout.pki_dir / 'service-account.key'}",
        f"--root-ca-file={layout.pki_dir / 'ca.crt'}",
        # The node gets its podCIDR from here: the first /<mask> of the cluster range.
        "--allocate-node-cidrs=true",
        f"--cluster-cidr={layout.cluster_cidr}",
        f"--node-cidr-mask-size={layout.node_cidr_mask}",
        f"--service-cluster-ip-range={layout.service_cidr}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
        *extra,
    ]


def scheduler_argv(layout: ClusterLayout) -> list[str]:
    kubeconfig = layout.kubeconfig("kube-scheduler")
    return [
        str(layout.binary("kube-scheduler")),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports.scheduler}",
        f"--cert-dir={layout.directory / 'scheduler-certs'}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def kubelet_config(layout: ClusterLayout, pod_cidr: str) -> dict[str, object]:
    endpoint = f"unix://{layout.containerd_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": layout.node_ip,
        "port": layout.ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": layout.ports.kubelet_healthz,
        # The API server execs and reads logs through the kubelet without credentials.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "podCIDR": pod_cidr,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "podLogsDir": str(layout.kubelet_dir / "pod-logs"),
        "volumePluginDir": str(layout.kubelet_dir / "volume-plugins"),
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "resolvConf": "/etc/resolv.conf",
        # Images are imported, never pulled: never garbage-collect them, and never
        # evict pods because other work fills the disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
    }


def kubelet_argv(layout: ClusterLayout, config_file: Path) -> list[str]:
    return [
        str(layout.binary("kubelet")),
        f"--config={config_file}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_dir / 'root'}",
        f"--cert-dir={layout.kubelet_dir / 'pki'}",
        f"--hostname-override={layout.node_name}",
        f"--node-ip={layout.node_ip}",
        "--v=1",
    ]


def kube_proxy_config(layout: ClusterLayout) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("kube-proxy"))},
        "hostnameOverride": layout.node_name,
        "mode": "iptables",
        "clusterCIDR": layout.cluster_cidr,
        "detectLocalMode": "ClusterCIDR",
        "metricsBindAddress": f"127.0.0.1:{layout.ports.proxy_metrics}",
        "healthzBindAddress": f"127.0.0.1:{layout.ports.proxy_healthz}",
        # NodePorts on the node address only, not on 127.0.0.1 (no route_localnet).
        "nodePortAddresses": [f"{layout.node_ip}/32"],
        "iptables": {"localhostNodePorts": False, "minSyncPeriod": "1s"},
        # Leave the host's conntrack table size and timeouts alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def kube_proxy_argv(layout: ClusterLayout, config_file: Path) -> list[str]:
    return [str(layout.binary("kube-proxy")), f"--config={config_file}", "--v=1"]


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
