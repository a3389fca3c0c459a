"""A whole single-node Kubernetes on this machine, with sluice as its only CNI.

``Cluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a
private containerd, the kubelet and kube-proxy (iptables mode), all from the cache,
all on non-default ports, everything under ``/var/lib/sluice-k8s/<name>``
(``SLUICE_K8S_RUN_DIR`` moves it). It is a context manager, and ``python -m
tests.harness up|down|status`` drives the same class.

Every step of ``up`` is recorded in ``<dir>/state.json`` before it runs, so ``down``
(the same object, or a later process after a crash) removes everything: pods
through CRI (sluice sees every DEL), daemons and containerd shims, kube-proxy's
rules, the kubelet's cgroups, the sluice network's bpffs directory and nftables
table, conntrack entries, mounts and directories.

``agent_argv`` is the hook for the sluice node agent: a function of the cluster
returning the agent's command line (``sluice_agent_argv`` builds the standard one),
started after ``sluicectl install`` and before the kubelet, and stopped once the
pods are gone (``replace_agent`` restarts it with another command line).
``install_args`` are appended to ``sluicectl install`` (e.g. ``("--policy",
"enforce")``).

``control_plane_only`` starts etcd, kube-apiserver and kube-controller-manager
and nothing on the node (no containerd, kubelet, kube-proxy, sluice): an API to
load with objects, which touches no iptables, nftables, route or cgroup, and so
may run beside a whole cluster on another port base (``SLUICE_K8S_PORT_BASE``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.harness import components, host, pki
from tests.harness.cache import PAUSE_IMAGE, K8sCache
from tests.harness.cluster_lifecycle import ClusterLifecycle
from tests.harness.cluster_state import ClusterError, ClusterState
from tests.harness.components import ClusterLayout, Ports
from tests.harness.containerd import (
    PrivateContainerd,
    find_crictl,
    remove_cni_cache_entries,
    unmount_all_under,
)
from tests.harness.host_facts import host_routes, node_address, node_name, processes_mentioning
from tests.harness.node_layout import (
    CLUSTER_CIDR,
    NODE_CIDR_MASK,
    SERVICE_CIDR,
    NodeHandle,
    NodeLayout,
)
from tests.harness.node_processes import (
    NodeProcesses,
    api_has,
    assert_running,
    run_steps,
    schedulable,
    wait_serving,
)
from tests.harness.processes import (
    Daemons,
    ProcessRecord,
    assert_port_free,
    is_alive,
    log_tail,
)

RUN_DIR_ENV = "SLUICE_K8S_RUN_DIR"
DEFAULT_RUN_DIR = Path("/var/lib/sluice-k8s")
PORT_BASE_ENV = "SLUICE_K8S_PORT_BASE"

SERVICE_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$")
HOST_TOOLS = ("etcd", "openssl", "containerd", "ctr", "conntrack", "iptables", "nft", "findmnt")

# Stopped in this order after the pods are gone (kubelet and agent are separate steps).
CONTROL_PLANE = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")

AgentArgv = Callable[["Cluster"], Sequence[str]]


def sluice_agent_argv(cluster: Cluster) -> list[str]:
    """The standard node agent command: serves the cluster's network, watches its API."""
    return cluster.layout.agent_argv(node_name())


class Cluster(ClusterLifecycle[ClusterState], NodeHandle):
    """A single-node cluster; ``with Cluster() as cluster:`` brings it up and down."""

    def __init__(
        self,
        name: str = "dev",
        *,
        cache: K8sCache | None = None,
        run_dir: Path | None = None,
        port_base: int | None = None,
        install_args: Sequence[str] = (),
        agent_argv: AgentArgv | None = None,
        keep_logs: Path | None = None,
        control_plane_only: bool = False,
        remote_nodes: bool = False,
    ) -> None:
        if not NAME_RE.match(name):
            raise ClusterError(f"cluster name {name!r}: use 1-20 of [a-z0-9-]")
        self.name = name
        self.cache = cache or K8sCache.default()
        self.run_dir = run_dir or Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)
        self.directory = self.run_dir / name
        base = port_base or int(os.environ.get(PORT_BASE_ENV) or components.DEFAULT_PORT_BASE)
        self.ports = Ports(base)
        self.install_args = tuple(install_args)
        self.agent_argv = agent_argv
        self.keep_logs = keep_logs
        # A control plane for nodes that run elsewhere (tests/harness/multinode.py): also
        # the scheduler, and the node lifecycle controller that lifts the not-ready taint.
        self.remote_nodes = remote_nodes
        self.control_plane_only = control_plane_only or remote_nodes
        self.network = f"k8s-{name}"
        self.bpf_dir = Path("/sys/fs/bpf") / f"sluice-k8s-{name}"
        self.cgroup_root = f"/sluice-k8s-{name}"
        # The node's files share the cluster's directory with the control plane's.
        self.layout = NodeLayout(
            directory=self.directory,
            containerd_base=self.directory / f"sluice-ctrd-{name}",
            network=self.network,
            bpf_dir=self.bpf_dir,
            cgroup_root=self.cgroup_root,
        )
        self._daemons = Daemons()
        self._containerd: PrivateContainerd | None = None
        self._state: ClusterState | None = None
        self._components: ClusterLayout | None = None

    # --- paths ----------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``export KUBECONFIG=...``)."""
        return self.kubeconfig_for("admin")

    def kubeconfig_for(self, client: str) -> Path:
        return self.layout.kubeconfig(client)

    @property
    def node_name(self) -> str:
        return self.state.node_name

    @property
    def node_ip(self) -> str:
        return self.state.node_ip

    @property
    def pod_cidr(self) -> str:
        """The node's podCIDR, which is sluice's IPAM subnet."""
        return self.state.pod_cidr

    @property
    def cluster_cidr(self) -> str:
        return CLUSTER_CIDR

    @property
    def service_cidr(self) -> str:
        return SERVICE_CIDR

    @property
    def containerd(self) -> PrivateContainerd:
        if self._containerd is None:
            self._containerd = self.layout.containerd()
        return self._containerd

    def _node(self) -> NodeProcesses:
        """The node's processes, recorded in the state file."""
        return NodeProcesses(
            self.layout,
            self.state.processes,
            self._save_state,
            self._daemons,
            self._wait,
            self.cache,
        )

    # --- clients --------------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cache.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}"
            )
        return proc

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    @contextlib.contextmanager
    def fresh_namespace(self) -> Iterator[str]:
        """A new namespace (``sluice-<random>``), deleted with everything in it afterwards."""
        name = f"sluice-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        try:
            # Pods are refused until the namespace's default ServiceAccount exists.
            self._wait(
                api_has(self.kubectl, "serviceaccount", "default", "-n", name),
                f"default ServiceAccount in namespace {name}",
            )
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=true", timeout=180)

    def log_tails(self, lines: int = 20) -> str:
        if not self.logs_dir.is_dir():
            return ""
        parts = [
            f"--- {log.name} ---\n{log_tail(log, lines)}" for log in sorted(self.logs_dir.iterdir())
        ]
        if self._containerd is not None:
            parts.append(f"--- containerd ---\n{self._containerd.log_tail(lines)}")
        return "\n".join(parts)

    # --- up -------------------------------------------------------------------------

    def _parse_state(self, data: dict[str, Any]) -> ClusterState:
        return ClusterState.from_json(data)

    def _check_host(self) -> None:
        absent = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
        if find_crictl() is None and not self.control_plane_only:
            absent.append("crictl")
        if absent:
            raise ClusterError(f"missing on this host: {', '.join(absent)} (run `make setup`)")

    def _up(self) -> None:
        started = time.monotonic()
        node_ip = node_address()
        self._check_free(node_ip)
        pod_cidr = str(next(ipaddress.IPv4Network(CLUSTER_CIDR).subnets(new_prefix=NODE_CIDR_MASK)))
        self.directory.mkdir(parents=True)
        self.directory.chmod(0o700)
        self._state = ClusterState(
            name=self.name,
            directory=str(self.directory),
            node_name=node_name(),
            node_ip=node_ip,
            port_base=self.ports.base,
            pod_cidr=pod_cidr,
            network=self.network,
            bpf_dir=str(self.bpf_dir),
            cgroup_root=self.cgroup_root,
            containerd_base=str(self.containerd_base),
            host=host.HostSnapshot.take(),
            control_plane_only=self.control_plane_only,
        )
        self._save_state()
        layout = self._components_for(self._state)
        self._write_credentials(layout)
        self._start_etcd(layout)
        self._start_apiserver(layout)
        # Nodes without a kubelet never report: without this, their pods would be evicted.
        without_kubelets = ("--controllers=*,-node-lifecycle-controller",)
        self._start(
            "kube-controller-manager",
            components.controller_manager_argv(
                layout,
                *(without_kubelets if self.control_plane_only and not self.remote_nodes else ()),
            ),
        )
        if self.control_plane_only:
            if self.remote_nodes:
                self._start("kube-scheduler", components.scheduler_argv(layout))
            # The admission plugin refuses pods until the namespace's default
            # ServiceAccount exists, which the controller manager makes a moment later.
            self._wait(
                api_has(self.kubectl, "serviceaccount", "default", "-n", "default"),
                "default ServiceAccount",
                120,
            )
            self._log(f"control plane up in {time.monotonic() - started:.0f} s")
            return
        self._start("kube-scheduler", components.scheduler_argv(layout))
        node = self._node()
        node.install_sluice(self.pod_cidr, self.install_args)
        node.start_containerd(self.containerd)
        self.containerd.wait_cri_ready(PAUSE_IMAGE, timeout=30)
        if self.agent_argv is not None:
            node.start_agent(list(self.agent_argv(self)), self.node_name)
        self._start_kubelet(layout)
        node.start_kube_proxy(layout)
        self._wait_ready()
        self._log(f"up in {time.monotonic() - started:.0f} s; KUBECONFIG={self.kubeconfig}")

    def _check_free(self, node_ip: str) -> None:
        for what, (address, port) in self.ports.listeners(node_ip).items():
            assert_port_free(address, port, what)
        if self.control_plane_only:
            return  # nothing on the node: another cluster's routes and chains do not matter
        for cidr in (CLUSTER_CIDR, SERVICE_CIDR):
            clashes = [str(r) for r in host_routes() if r.overlaps(ipaddress.ip_network(cidr))]
            if clashes:
                raise ClusterError(f"range {cidr} overlaps host routes {clashes}")
        if self.bpf_dir.exists():
            raise ClusterError(f"{self.bpf_dir} exists: another cluster named {self.name}?")
        # kube-proxy --cleanup and the teardown remove every KUBE-* chain on the host.
        chains = host.kube_iptables_chains()
        if chains:
            raise ClusterError(
                f"iptables already holds {chains[0]} (and {len(chains) - 1} more KUBE-* "
                "chains): another Kubernetes runs here; one cluster per host at a time"
            )

    def _components_for(self, state: ClusterState) -> ClusterLayout:
        if self._components is None:
            ports = Ports(state.port_base)
            self._components = self.layout.components(
                self.cache, ports, state.node_name, state.node_ip
            )
        return self._components

    def _start(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        return self._node().start(name, argv)

    def _assert_running(self) -> None:
        assert_running(self._daemons, self.state.processes)
        if self._containerd is not None and not self._containerd.running:
            raise ClusterError(f"containerd exited:\n{self._containerd.log_tail()}")

    def _write_credentials(self, layout: ClusterLayout) -> None:
        users = {
            "admin": "sluice-admin",
            "kube-controller-manager": "system:kube-controller-manager",
            "kube-scheduler": "system:kube-scheduler",
            "kube-proxy": "system:kube-proxy",
            "kubelet": f"system:node:{layout.node_name}",
            "sluice-agent": "system:sluice-agent",
            "sluice-controller": "system:sluice-controller",
        }
        service_ip = str(next(ipaddress.IPv4Network(SERVICE_CIDR).hosts()))
        paths, tokens = pki.create_pki(
            layout.pki_dir,
            ip_sans=[layout.node_ip, "127.0.0.1", service_ip],
            dns_sans=[layout.node_name, *SERVICE_DNS_NAMES],
            users=users,
        )
        for client, user in users.items():
            pki.write_kubeconfig(
                layout.kubeconfig(client),
                server=layout.apiserver_url,
                ca_cert=paths.ca_cert,
                token=tokens[client],
                user=user,
            )

    def _start_etcd(self, layout: ClusterLayout) -> None:
        # etcd fsyncs every write; on tmpfs that costs nothing, and the data is throw-away.
        layout.etcd_dir.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2g,mode=0700", "tmpfs", str(layout.etcd_dir)],
            check=True,
            capture_output=True,
        )
        self._start("etcd", components.etcd_argv(layout))
        url = f"http://127.0.0.1:{layout.ports.etcd_client}/health"
        self._wait(lambda: b'"health":"true"' in _http_get(url), "etcd healthy")

    def _start_apiserver(self, layout: ClusterLayout) -> None:
        self._start("kube-apiserver", components.apiserver_argv(layout))
        context = ssl.create_default_context(cafile=str(layout.pki_dir / "ca.crt"))
        url = f"{layout.apiserver_url}/readyz"
        self._wait(lambda: _http_get(url, context) == b"ok", "kube-apiserver ready", timeout=90)

    def replace_agent(self, argv: Sequence[str], wait_ready: bool = True) -> ProcessRecord:
        """Stop the node agent (SIGTERM: its pinned datapath keeps enforcing) and start
        ``argv`` in its place, under the same name, so ``down`` stops it."""
        node = self._node()
        node.stop("sluice-agent")
        return node.start_agent(list(argv), self.node_name, wait_ready)

    def stop_agent(self, crash: bool = False) -> None:
        """Stop the node agent: SIGTERM, or SIGKILL as a crash would."""
        self._node().withdraw("sluice-agent", crash)

    def start_agent(self) -> None:
        """Start the node agent again (after ``stop_agent``) and wait until it serves."""
        if self.agent_argv is not None:
            self._node().start_agent(list(self.agent_argv(self)), self.node_name)

    def _start_kubelet(self, layout: ClusterLayout) -> None:
        config = components.kubelet_config(layout, self.pod_cidr)
        cidr = self._node().start_kubelet(layout, config, self.kubectl)
        if cidr != self.pod_cidr:
            raise ClusterError(
                f"node {layout.node_name} got podCIDR {cidr}, but sluice serves {self.pod_cidr}"
            )

    def _wait_ready(self) -> None:
        self._wait(
            lambda: schedulable(self.kubectl_json("get", "node", self.node_name)),
            f"node {self.node_name} Ready without NoSchedule taints",
            120,
        )
        wait_serving(self._wait, self.kubectl, {self.node_name: self._node()})

    # --- down -----------------------------------------------------------------------

    def down(self) -> list[str]:
        """Remove everything ``up`` created; return what could not be removed (if anything).

        Works on the object that ran ``up`` and, from the state file, in any later
        process. Each step runs even when an earlier one failed.
        """
        state = self._state or self._load_state()
        if state is None:
            if self.directory.exists():
                raise ClusterError(f"{self.directory} exists without a state file; remove it")
            return []
        self._state = state
        started = time.monotonic()
        steps: list[tuple[str, Callable[[], object]]] = [
            *(
                (f"stop {name}", lambda name=name: self._node().stop(name))
                for name in CONTROL_PLANE
            ),
            ("unmount", lambda: unmount_all_under(self.directory)),
            ("keep logs", self._keep_logs),
            ("remove the cluster directory", self._remove_directory),
        ]
        if not state.control_plane_only:
            steps = self._node_teardown(state)
        errors = run_steps(steps)
        leftovers = self.leftovers()
        self._state = None
        self._containerd = None
        self._log(f"down in {time.monotonic() - started:.0f} s")
        if errors:
            raise ClusterError(
                f"cluster {self.name} teardown failed:\n" + "\n".join(errors + leftovers)
            )
        return leftovers

    def _node_teardown(self, state: ClusterState) -> list[tuple[str, Callable[[], object]]]:
        """Every step of a whole cluster's ``down``, in order."""
        node = self._node()
        return [
            *node.stop_steps(lambda: self.containerd),
            ("kube-proxy --cleanup", self._kube_proxy_cleanup),
            *((f"stop {name}", lambda name=name: node.stop(name)) for name in CONTROL_PLANE),
            ("release sluice's leftovers", self._release_sluice),
            ("remove iptables KUBE-* chains", host.remove_kube_iptables_chains),
            ("remove nftables tables", lambda: host.remove_new_nft_tables(state.host)),
            ("flush conntrack", lambda: host.flush_conntrack([CLUSTER_CIDR, SERVICE_CIDR])),
            ("restore sysctls", lambda: host.restore_sysctls(state.host)),
            ("remove cgroups", lambda: host.remove_cgroups(state.cgroup_root)),
            ("remove libcni cache entries", lambda: remove_cni_cache_entries([state.network])),
            ("unmount", lambda: unmount_all_under(self.directory)),
            ("keep logs", self._keep_logs),
            ("remove the cluster directory", self._remove_directory),
            (
                "remove host directories",
                lambda: host.remove_created_paths(state.host, self.directory),
            ),
        ]

    def _kube_proxy_cleanup(self) -> None:
        binary = self.cache.binary("kube-proxy")
        if binary.exists():
            subprocess.run(
                [str(binary), "--cleanup", "--v=0"], capture_output=True, check=False, timeout=120
            )

    def _release_sluice(self) -> None:
        """Normally a no-op: every pod's DEL already released its veth and address."""
        if self.sluice_conf.exists():
            self.sluicectl("ipam", "gc", "--none-valid", check=False)
        for veth in self._sluice_veths():
            subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False)
        subprocess.run(
            ["nft", "delete", "table", "ip", f"sluice_{self.network}"],
            capture_output=True,
            check=False,
        )
        if self.bpf_dir.exists():
            shutil.rmtree(self.bpf_dir)

    def _sluice_veths(self) -> list[str]:
        """Node-side veths whose alias names this cluster's network."""
        out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
        prefix = f"sluice/{self.network}/"
        return [
            link["ifname"]
            for link in json.loads(out.stdout or "[]")
            if str(link.get("ifalias", "")).startswith(prefix)
        ]

    def _keep_logs(self) -> None:
        if self.keep_logs is not None:
            self._node().keep_logs(self.keep_logs)

    def _remove_directory(self) -> None:
        if self.directory.exists():
            shutil.rmtree(self.directory)
        with contextlib.suppress(OSError):
            self.run_dir.rmdir()

    # --- checks ---------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """Anything of this cluster still on the host (empty after a clean ``down``)."""
        state = self.state
        found: list[str] = []
        for record in state.processes.values():
            if is_alive(record):
                found.append(f"process {record.name} (pid {record.pid})")
        found += [f"process {p}" for p in processes_mentioning(f"{self.directory}/")]
        if state.control_plane_only:  # the node's state may be another cluster's
            if self.directory.exists():
                found.append(f"directory {self.directory}")
            return found
        found += [f"veth {v}" for v in self._sluice_veths()]
        if self.bpf_dir.exists():
            found.append(f"bpffs {self.bpf_dir}")
        tables = host.nft_tables()
        if ("ip", f"sluice_{self.network}") in tables:
            found.append(f"nftables table ip sluice_{self.network}")
        before = {tuple(t) for t in state.host.nft_tables}
        new_tables = (tables - before) & host.NFT_TABLES_KUBERNETES_MAY_CREATE
        found += [f"nftables table {f} {t}" for f, t in sorted(new_tables)]
        found += [f"iptables chain {c}" for c in host.kube_iptables_chains()]
        found += [f"conntrack {e}" for e in host.conntrack_entries([self.pod_cidr])]
        found += [f"cgroup {d}" for d in host.cgroup_dirs(state.cgroup_root)]
        if self.directory.exists():
            found.append(f"directory {self.directory}")
        return found

    def status(self) -> dict[str, Any]:
        state = self.state
        processes = {name: is_alive(r) for name, r in state.processes.items()}
        nodes = self.kubectl("get", "nodes", "-o", "wide", check=False)
        return {
            "name": self.name,
            "kubeconfig": str(self.kubeconfig),
            "node": state.node_name,
            "podCIDR": state.pod_cidr,
            "serviceCIDR": SERVICE_CIDR,
            "sluiceConf": str(self.sluice_conf),
            "bpfDir": state.bpf_dir,
            "processes": processes,
            "nodes": nodes.stdout.strip() or nodes.stderr.strip(),
        }


def _http_get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.read()
    except (urllib.error.URLError, OSError):
        return b""
