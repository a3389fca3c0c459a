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
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness import components, host, pki
from tests.harness.cache import AGNHOST_IMAGE, PAUSE_IMAGE, K8sCache
from tests.harness.components import ClusterLayout, Ports
from tests.harness.containerd import (
    CRI_NAMESPACE,
    PrivateContainerd,
    find_crictl,
    remove_cni_cache_entries,
    unmount_all_under,
)
from tests.harness.processes import (
    Daemons,
    ProcessRecord,
    assert_port_free,
    is_alive,
    log_tail,
    process_start_time,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SLUICECTL = REPO_ROOT / ".venv" / "bin" / "sluicectl"
LOOPBACK_PLUGIN = Path("/usr/lib/cni/loopback")  # containerd's CRI runs it for `lo`

RUN_DIR_ENV = "SLUICE_K8S_RUN_DIR"
DEFAULT_RUN_DIR = Path("/var/lib/sluice-k8s")
PORT_BASE_ENV = "SLUICE_K8S_PORT_BASE"

CLUSTER_CIDR = "10.244.0.0/16"
NODE_CIDR_MASK = 24
SERVICE_CIDR = "10.96.0.0/16"
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


class ClusterError(RuntimeError):
    pass


def sluice_agent_argv(cluster: Cluster) -> list[str]:
    """The standard node agent command: serves the cluster's network, watches its API."""
    return [
        str(SLUICECTL),
        "agent",
        "--conf",
        str(cluster.sluice_conf),
        "--kubeconfig",
        str(cluster.kubeconfig_for("sluice-agent")),
        "--node-name",
        node_name(),
    ]


def node_address() -> str:
    """The node's address: the source of its default route."""
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "get", "1.0.0.0"], capture_output=True, text=True, check=True
    ).stdout
    routes = json.loads(out)
    if not routes or "prefsrc" not in routes[0]:
        raise ClusterError(f"cannot tell the node address from `ip route get 1.0.0.0`: {out}")
    return routes[0]["prefsrc"]


def node_name() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return name if re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name) else "sluice-node"


def host_routes() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    nets = []
    for route in json.loads(out or "[]"):
        with contextlib.suppress(ValueError):
            if route.get("dst") not in (None, "default"):
                nets.append(ipaddress.ip_network(route["dst"], strict=False))
    return nets


@dataclass
class ClusterState:
    """What ``down`` needs to undo ``up``, written to ``<dir>/state.json`` as it grows."""

    name: str
    directory: str
    node_name: str
    node_ip: str
    port_base: int
    pod_cidr: str
    network: str
    bpf_dir: str
    cgroup_root: str
    containerd_base: str
    host: host.HostSnapshot
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    control_plane_only: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["host"] = self.host.to_json()
        data["processes"] = {k: v.to_json() for k, v in self.processes.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        # Tolerate keys written by other versions of this harness.
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["host"] = host.HostSnapshot.from_json(data["host"])
        data["processes"] = {
            k: ProcessRecord.from_json(v) for k, v in data.get("processes", {}).items()
        }
        return cls(**data)


class Cluster:
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
        self._daemons = Daemons()
        self._containerd: PrivateContainerd | None = None
        self._state: ClusterState | None = None
        self._layout: ClusterLayout | None = None

    # --- paths ----------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``export KUBECONFIG=...``)."""
        return self.kubeconfig_for("admin")

    def kubeconfig_for(self, client: str) -> Path:
        return self.directory / f"{client}.kubeconfig"

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

    @property
    def containerd_base(self) -> Path:
        return self.directory / f"sluice-ctrd-{self.name}"

    @property
    def state(self) -> ClusterState:
        if self._state is None:
            self._state = self._load_state()
            if self._state is None:
                raise ClusterError(f"cluster {self.name} is not up (no {self.state_file})")
        return self._state

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
            self._containerd = self._containerd_handle()
        return self._containerd

    # --- context manager ----------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        leftovers = self.down()
        if leftovers and exc is None:
            raise ClusterError(f"cluster {self.name} left behind: {leftovers}")

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
                self._exists("serviceaccount", "default", "-n", name),
                f"default ServiceAccount in namespace {name}",
            )
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=true", timeout=180)

    def sluicectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sluicectl`` with the cluster's network config (``--conf`` is added)."""
        argv = [str(SLUICECTL), *args, "--conf", str(self.sluice_conf)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"sluicectl {' '.join(args)} exited {proc.returncode}: "
                f"{proc.stdout.strip()} {proc.stderr.strip()}"
            )
        return proc

    def log_path(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

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

    def up(self) -> None:
        """Start everything and wait until the node is Ready; on failure, undo it all."""
        if self.state_file.exists():
            raise ClusterError(
                f"cluster {self.name} already has state in {self.state_file}: it is up, or an "
                f"earlier up crashed; run `python -m tests.harness down --name {self.name}` first"
            )
        missing = self.cache.missing()
        if missing:
            raise ClusterError(
                f"the Kubernetes cache {self.cache.root} lacks {', '.join(p.name for p in missing)}"
                ": run `make k8s-build` (python -m tests.harness build)"
            )
        absent = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
        if find_crictl() is None and not self.control_plane_only:
            absent.append("crictl")
        if absent:
            raise ClusterError(f"missing on this host: {', '.join(absent)} (run `make setup`)")
        try:
            self._up()
        except BaseException:
            print(f"cluster {self.name} failed to come up:\n{self.log_tails()}", file=sys.stderr)
            with contextlib.suppress(Exception):
                self.down()
            raise

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
        layout = self._layout_for(self._state)
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
                self._exists("serviceaccount", "default", "-n", "default"),
                "default ServiceAccount",
                120,
            )
            self._log(f"control plane up in {time.monotonic() - started:.0f} s")
            return
        self._start("kube-scheduler", components.scheduler_argv(layout))
        self._install_sluice()
        self._start_containerd()
        self._start_agent()
        self._start_kubelet(layout)
        self._start_kube_proxy(layout)
        self._wait_ready()
        self._log(f"up in {time.monotonic() - started:.0f} s; KUBECONFIG={self.kubeconfig}")

    def _log(self, message: str) -> None:
        print(f"[k8s {self.name}] {message}", file=sys.stderr, flush=True)

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

    def _layout_for(self, state: ClusterState) -> ClusterLayout:
        if self._layout is None:
            self._layout = ClusterLayout(
                directory=self.directory,
                cache=self.cache,
                ports=Ports(state.port_base),
                node_name=state.node_name,
                node_ip=state.node_ip,
                cluster_cidr=CLUSTER_CIDR,
                node_cidr_mask=NODE_CIDR_MASK,
                service_cidr=SERVICE_CIDR,
                containerd_socket=Path(state.containerd_base) / "containerd.sock",
                cgroup_root=state.cgroup_root,
            )
        return self._layout

    def _save_state(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state.to_json(), indent=2) + "\n")
        tmp.replace(self.state_file)

    def _start(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = self._daemons.start(name, argv, self.log_path(name))
        self.state.processes[name] = record
        self._save_state()
        return record

    def _assert_running(self) -> None:
        for record in self.state.processes.values():
            code = self._daemons.exited(record)
            if code is not None:
                raise ClusterError(
                    f"{record.name} exited ({code}); tail of {record.log}:\n{log_tail(record.log)}"
                )
        if self._containerd is not None and not self._containerd.running:
            raise ClusterError(f"containerd exited:\n{self._containerd.log_tail()}")

    def _exists(self, *what: str) -> Callable[[], bool]:
        return lambda: self.kubectl("get", *what, check=False).returncode == 0

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        def check() -> bool:
            self._assert_running()
            return condition()

        wait_until(check, timeout=timeout, what=what, details=lambda: self.log_tails(15))

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

    def _install_sluice(self) -> None:
        self.cni_bin_dir.mkdir(parents=True)
        self.cni_conf_dir.mkdir(parents=True)
        self.sluice_state_dir.mkdir(parents=True)
        argv = [
            str(SLUICECTL),
            "install",
            f"--bin-dir={self.cni_bin_dir}",
            f"--conf-dir={self.cni_conf_dir}",
            f"--conf-name={self.sluice_conf.name}",
            f"--name={self.network}",
            f"--subnet={self.pod_cidr}",
            f"--cluster-cidr={CLUSTER_CIDR}",
            # containerd 1.6's libcni knows results up to 1.0.0.
            "--cni-version=1.0.0",
            "--policy=off",
            f"--state-dir={self.sluice_state_dir}",
            f"--bpf-dir={self.bpf_dir}",
            f"--agent-socket={self.agent_socket}",
            *self.install_args,  # later options win
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        (self.cni_bin_dir / LOOPBACK_PLUGIN.name).symlink_to(LOOPBACK_PLUGIN)

    def _containerd_handle(self) -> PrivateContainerd:
        return PrivateContainerd(
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            sandbox_image=PAUSE_IMAGE,
            base=Path(self.state.containerd_base),
        )

    def _start_containerd(self) -> None:
        containerd = self.containerd
        containerd.start()
        assert containerd.pid is not None
        start_time = process_start_time(containerd.pid)
        self.state.processes["containerd"] = ProcessRecord(
            "containerd",
            containerd.pid,
            start_time or 0,
            ["containerd", "--config", str(containerd.config_path)],
            str(containerd.log_path),
        )
        self._save_state()
        for image in (PAUSE_IMAGE, AGNHOST_IMAGE):
            containerd.import_image(self.cache.image_tar(image), namespace=CRI_NAMESPACE)
        containerd.wait_cri_ready(PAUSE_IMAGE, timeout=30)

    def _start_agent(self) -> None:
        if self.agent_argv is None:
            return
        self._start("sluice-agent", list(self.agent_argv(self)))
        # Ready when the plugin can serve an ADD (with "enforce" that needs the agent).
        self._wait(self.sluice_ready, "sluicectl status to report the node ready", 120)

    def replace_agent(self, argv: Sequence[str], wait_ready: bool = True) -> ProcessRecord:
        """Stop the node agent (SIGTERM: its pinned datapath keeps enforcing) and start
        ``argv`` in its place, under the same name, so ``down`` stops it."""
        self._stop_process("sluice-agent")
        record = self._start("sluice-agent", list(argv))
        if wait_ready:
            self._wait(self.sluice_ready, "sluicectl status to report the node ready", 120)
        return record

    def stop_agent(self, crash: bool = False) -> None:
        """Stop the node agent: SIGTERM, or SIGKILL as a crash would."""
        record = self.state.processes.pop("sluice-agent")
        self._save_state()
        if crash:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        self._daemons.stop(record)

    def start_agent(self) -> None:
        """Start the node agent again (after ``stop_agent``) and wait until it serves."""
        self._start_agent()

    def sluice_ready(self) -> bool:
        """`sluicectl status`: an ADD can be served now (with "enforce": the agent is up)."""
        status = self.sluicectl("status", f"--bin-dir={self.cni_bin_dir}", check=False)
        return status.returncode == 0

    def _start_kubelet(self, layout: ClusterLayout) -> None:
        layout.kubelet_dir.mkdir()
        host.create_cgroups(layout.cgroup_root)
        config = components.write_json(
            layout.kubelet_dir / "config.json", components.kubelet_config(layout, self.pod_cidr)
        )
        self._start("kubelet", components.kubelet_argv(layout, config))

        def registered_with_cidr() -> bool:
            proc = self.kubectl("get", "node", layout.node_name, "-o", "json", check=False)
            if proc.returncode != 0:
                return False
            cidr = json.loads(proc.stdout).get("spec", {}).get("podCIDR")
            if cidr and cidr != self.pod_cidr:
                raise ClusterError(
                    f"node {layout.node_name} got podCIDR {cidr}, but sluice serves {self.pod_cidr}"
                )
            return cidr == self.pod_cidr

        self._wait(registered_with_cidr, f"node {layout.node_name} registered with a podCIDR")

    def _start_kube_proxy(self, layout: ClusterLayout) -> None:
        config = components.write_json(
            self.directory / "kube-proxy.json", components.kube_proxy_config(layout)
        )
        self._start("kube-proxy", components.kube_proxy_argv(layout, config))

    def _wait_ready(self) -> None:
        def node_ready() -> bool:
            node = self.kubectl_json("get", "node", self.node_name)
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )
            taints = [t for t in node.get("spec", {}).get("taints", []) or []]
            return ready and not any(t.get("effect") == "NoSchedule" for t in taints)

        self._wait(node_ready, f"node {self.node_name} Ready without NoSchedule taints", 120)
        self._wait(
            self._exists("serviceaccount", "default", "-n", "default"), "default ServiceAccount"
        )
        self._wait(
            self._exists("configmap", "kube-root-ca.crt", "-n", "default"), "kube-root-ca.crt"
        )

        def services_programmed() -> bool:
            nat = subprocess.run(
                ["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"],
                capture_output=True,
                text=True,
                check=False,
            )
            return "default/kubernetes:https" in nat.stdout

        self._wait(services_programmed, "kube-proxy to program the kubernetes Service")

    # --- down -----------------------------------------------------------------------

    def _load_state(self) -> ClusterState | None:
        try:
            return ClusterState.from_json(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            raise ClusterError(f"{self.state_file} is unreadable: {exc}") from exc

    def is_up(self) -> bool:
        return self.state_file.exists()

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
        errors: list[str] = []
        steps: list[tuple[str, Callable[[], object]]] = [
            *(
                (f"stop {name}", lambda name=name: self._stop_process(name))
                for name in CONTROL_PLANE
            ),
            ("unmount", lambda: unmount_all_under(self.directory)),
            ("keep logs", self._keep_logs),
            ("remove the cluster directory", self._remove_directory),
        ]
        if not state.control_plane_only:
            steps = self._node_teardown(state)
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(f"{what}: {exc}")
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
        return [
            ("stop kubelet", lambda: self._stop_process("kubelet")),
            ("remove pods through CRI", self._remove_pods),
            ("stop the sluice agent", lambda: self._stop_process("sluice-agent")),
            ("stop containerd", self._stop_containerd),
            ("stop kube-proxy", lambda: self._stop_process("kube-proxy")),
            ("kube-proxy --cleanup", self._kube_proxy_cleanup),
            *(
                (f"stop {name}", lambda name=name: self._stop_process(name))
                for name in CONTROL_PLANE
            ),
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

    def _stop_process(self, name: str) -> None:
        record = self.state.processes.get(name)
        if record is not None:
            self._daemons.stop(record)

    def _remove_pods(self) -> None:
        record = self.state.processes.get("containerd")
        if record is None or not is_alive(record):
            return
        containerd = self.containerd
        for pod in containerd.crictl("pods", "-q", check=False, timeout=30).stdout.split():
            containerd.remove_pod(pod, check=False)

    def _stop_containerd(self) -> None:
        containerd = self.containerd
        record = self.state.processes.get("containerd")
        if not containerd.running and record is not None:
            self._daemons.stop(record)  # started by another process
        containerd.close()

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
        if self.keep_logs is None:
            return
        self.keep_logs.mkdir(parents=True, exist_ok=True)
        if self.logs_dir.is_dir():
            for log in self.logs_dir.iterdir():
                shutil.copy2(log, self.keep_logs / log.name)
        containerd_log = self.containerd_base / "containerd.log"
        if containerd_log.exists():
            shutil.copy2(containerd_log, self.keep_logs / "containerd.log")

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


def processes_mentioning(text: str) -> list[str]:
    """``pid argv0`` of every process whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if int(cmdline.parent.name) != os.getpid() and any(text in a for a in argv):
                found.append(f"{cmdline.parent.name} {argv[0]}")
    return found


def _http_get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.read()
    except (urllib.error.URLError, OSError):
        return b""
