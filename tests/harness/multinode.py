"""Several real Kubernetes nodes on one machine, joined to one control plane.

The control plane (etcd, kube-apiserver, kube-controller-manager allocating each
node a /24 of 10.244.0.0/16, kube-scheduler) runs on the host as a ``Cluster``
with ``remote_nodes`` (directory ``<run dir>/<name>``, port base 25000 unless
``SLUICE_K8S_PORT_BASE`` says otherwise, so it runs beside the single-node
cluster). Each node ``i`` is a network namespace on a shared bridge
(``node_network.NodeNetwork``: 172.31.<base/1000>.0/24, node ``i`` at ``.10+i``)
with its own containerd (root, state, socket), kubelet (root dir, ``--node-ip``,
cgroup root ``/sluice-k8s-<name>-n<i>``), kube-proxy (iptables, inside the
namespace), CNI directories, and sluice (``stateDir``, ``bpfDir``, socket, agent),
all under ``<run dir>/<name>-nodes/n<i>``. The node processes share the host's
mount namespace (the kubelet's volume mounts must reach containerd) and differ by
paths only.

A node's network comes up once the controller-manager gave it a podCIDR: the
kubelet registers first, then ``sluicectl install --subnet <podCIDR>`` writes the
conflist that containerd picks up, and the agent starts. ``routes="static"`` puts
on each node every other node's podCIDR via that node's address (kindnet's
recipe); ``routes="agent"`` leaves that to sluice's agent. ``cni="ptp"`` installs
the reference plugins (ptp + host-local) instead of sluice, for benchmarks.

Every step is recorded in ``<run dir>/<name>-nodes/state.json`` before it runs, so
``down`` (also from a later process) removes everything: pods through CRI, the
daemons, the namespaces (with their veths, routes, nft and iptables rules), bpffs
directories, cgroups, mounts, then the control plane.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness import components, host
from tests.harness.cache import AGNHOST_IMAGE, PAUSE_IMAGE, K8sCache
from tests.harness.cluster import (
    CLUSTER_CIDR,
    DEFAULT_RUN_DIR,
    LOOPBACK_PLUGIN,
    NAME_RE,
    PORT_BASE_ENV,
    RUN_DIR_ENV,
    SERVICE_CIDR,
    SLUICECTL,
    Cluster,
    ClusterError,
    host_routes,
    processes_mentioning,
)
from tests.harness.components import ClusterLayout, Ports
from tests.harness.containerd import (
    CRI_NAMESPACE,
    PrivateContainerd,
    remove_cni_cache_entries,
    unmount_all_under,
)
from tests.harness.node_network import NodeNetwork, in_netns
from tests.harness.processes import (
    Daemons,
    ProcessRecord,
    is_alive,
    log_tail,
    process_start_time,
    wait_until,
)

DEFAULT_PORT_BASE = 25000
DEFAULT_NAME = "multi"
REFERENCE_PLUGINS = Path("/usr/lib/cni")
POLICY_CRDS = Path(__file__).resolve().parents[2] / "conf" / "policyendpoints.yaml"
ROUTES = ("static", "agent")
CNIS = ("sluice", "ptp")
RESOLVERS = ("agent", "controller")


@dataclass
class NodeState:
    index: int
    name: str  # the Node object's name
    netns: str
    address: str
    directory: str
    bpf_dir: str
    cgroup_root: str
    pod_cidr: str = ""
    processes: dict[str, ProcessRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = {k: v.to_json() for k, v in self.processes.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["processes"] = {
            k: ProcessRecord.from_json(v) for k, v in data.get("processes", {}).items()
        }
        return cls(**data)


@dataclass
class MultiNodeState:
    name: str
    prefix: str
    subnet: str
    routes: str
    cni: str
    resolver: str
    host: host.HostSnapshot
    nodes: list[NodeState] = field(default_factory=list)
    processes: dict[str, ProcessRecord] = field(default_factory=dict)  # on the host

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("name", "prefix", "subnet", "routes", "cni")},
            "resolver": self.resolver,
            "host": self.host.to_json(),
            "nodes": [n.to_json() for n in self.nodes],
            "processes": {k: v.to_json() for k, v in self.processes.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MultiNodeState:
        return cls(
            name=data["name"],
            prefix=data["prefix"],
            subnet=data["subnet"],
            routes=data["routes"],
            cni=data.get("cni", "sluice"),
            resolver=data.get("resolver", "agent"),
            host=host.HostSnapshot.from_json(data["host"]),
            nodes=[NodeState.from_json(n) for n in data.get("nodes", [])],
            processes={k: ProcessRecord.from_json(v) for k, v in data.get("processes", {}).items()},
        )


class Node:
    """One node of the cluster: paths and clients (its processes are in the state)."""

    def __init__(self, cluster: MultiNodeCluster, state: NodeState) -> None:
        self.cluster = cluster
        self.state = state

    @property
    def index(self) -> int:
        return self.state.index

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def netns(self) -> str:
        return self.state.netns

    @property
    def address(self) -> str:
        return self.state.address

    @property
    def pod_cidr(self) -> str:
        return self.state.pod_cidr

    @property
    def directory(self) -> Path:
        return Path(self.state.directory)

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
    def containerd_base(self) -> Path:
        return self.directory / f"sluice-ctrd-{self.cluster.name}-n{self.index}"

    def log_path(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    def layout(self) -> ClusterLayout:
        return ClusterLayout(
            directory=self.directory,
            cache=self.cluster.cache,
            ports=self.cluster.ports,
            node_name=self.name,
            node_ip=self.address,
            cluster_cidr=CLUSTER_CIDR,
            node_cidr_mask=24,
            service_cidr=SERVICE_CIDR,
            containerd_socket=self.containerd_base / "containerd.sock",
            cgroup_root=self.state.cgroup_root,
        )

    def containerd(self) -> PrivateContainerd:
        return PrivateContainerd(
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            sandbox_image=PAUSE_IMAGE,
            base=self.containerd_base,
            netns=self.netns,
        )

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """A command in the node's network namespace."""
        return subprocess.run(
            in_netns(self.netns, [str(a) for a in argv]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def sluicectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = self.run([str(SLUICECTL), *args, "--conf", str(self.sluice_conf)], timeout=120)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"node {self.name}: sluicectl {' '.join(args)} exited {proc.returncode}: "
                f"{proc.stdout.strip()} {proc.stderr.strip()}"
            )
        return proc

    def sluice_ready(self) -> bool:
        return (
            self.sluicectl("status", f"--bin-dir={self.cni_bin_dir}", check=False).returncode == 0
        )


class MultiNodeCluster:
    """``with MultiNodeCluster(nodes=3) as cluster:`` brings a cluster of 3 nodes up
    and down; ``python -m tests.harness up --nodes 3`` drives the same class."""

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        *,
        nodes: int = 3,
        cache: K8sCache | None = None,
        run_dir: Path | None = None,
        port_base: int | None = None,
        install_args: Sequence[str] = (),
        agent: bool = True,
        resolver: str = "agent",
        routes: str = "agent",
        cni: str = "sluice",
        keep_logs: Path | None = None,
    ) -> None:
        if not NAME_RE.match(name) or len(name) > 12:
            raise ClusterError(f"cluster name {name!r}: use 1-12 of [a-z0-9-]")
        if nodes < 1:
            raise ClusterError(f"--nodes {nodes}: at least one node")
        for what, value, choices in (
            ("routes", routes, ROUTES),
            ("cni", cni, CNIS),
            ("resolver", resolver, RESOLVERS),
        ):
            if value not in choices:
                raise ClusterError(f"{what} {value!r}: one of {', '.join(choices)}")
        self.name = name
        self.node_count = nodes
        self.cache = cache or K8sCache.default()
        self.run_dir = run_dir or Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)
        self.directory = self.run_dir / f"{name}-nodes"
        base = port_base or int(os.environ.get(PORT_BASE_ENV) or DEFAULT_PORT_BASE)
        self.ports = Ports(base)
        self.install_args = tuple(install_args)
        self.agent = agent
        self.resolver = resolver
        self.routes = routes
        self.cni = cni
        self.keep_logs = keep_logs
        self.network = f"k8s-{name}"
        self.control_plane = Cluster(
            name,
            cache=self.cache,
            run_dir=self.run_dir,
            port_base=base,
            keep_logs=keep_logs / "control-plane" if keep_logs else None,
            remote_nodes=True,
        )
        self.node_network = NodeNetwork.for_cluster(name, (base // 1000) % 256)
        self._daemons = Daemons()
        self._state: MultiNodeState | None = None

    # --- paths and clients ------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.directory / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def kubeconfig_for(self, client: str) -> Path:
        return self.control_plane.kubeconfig_for(client)

    @property
    def state(self) -> MultiNodeState:
        if self._state is None:
            self._state = self._load_state()
            if self._state is None:
                raise ClusterError(f"cluster {self.name} is not up (no {self.state_file})")
        return self._state

    @property
    def nodes(self) -> list[Node]:
        return [Node(self, n) for n in self.state.nodes]

    def node(self, index: int) -> Node:
        return next(n for n in self.nodes if n.index == index)

    @property
    def cluster_cidr(self) -> str:
        return CLUSTER_CIDR

    @property
    def service_cidr(self) -> str:
        return SERVICE_CIDR

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.control_plane.kubectl(*args, **kwargs)

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.control_plane.kubectl_json(*args, timeout=timeout)

    def fresh_namespace(self) -> contextlib.AbstractContextManager[str]:
        return self.control_plane.fresh_namespace()

    def is_up(self) -> bool:
        return self.state_file.exists()

    # --- context manager --------------------------------------------------------------

    def __enter__(self) -> MultiNodeCluster:
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

    # --- up ---------------------------------------------------------------------------

    def up(self) -> None:
        if self.state_file.exists():
            raise ClusterError(
                f"cluster {self.name} already has state in {self.state_file}: run "
                f"`python -m tests.harness down --name {self.name}` first"
            )
        missing = self.cache.missing()
        if missing:
            raise ClusterError(
                f"the Kubernetes cache {self.cache.root} lacks {missing[0].name}: "
                "run `make k8s-build`"
            )
        try:
            self._up()
        except BaseException:
            print(f"cluster {self.name} failed to come up:\n{self.log_tails()}", file=sys.stderr)
            with contextlib.suppress(Exception):
                self.down()
            raise

    def _up(self) -> None:
        started = time.monotonic()
        subnet = ipaddress.ip_network(self.node_network.subnet)
        clashes = [str(r) for r in host_routes() if r.overlaps(subnet)]
        if clashes:
            raise ClusterError(f"node network {subnet} overlaps host routes {clashes}")
        for index in range(1, self.node_count + 1):
            bpf_dir = self._bpf_dir(index)
            if bpf_dir.exists():
                raise ClusterError(f"{bpf_dir} exists: another cluster named {self.name}?")
        self.directory.mkdir(parents=True)
        self.directory.chmod(0o700)
        self._state = MultiNodeState(
            name=self.name,
            prefix=self.node_network.prefix,
            subnet=self.node_network.subnet,
            routes=self.routes,
            cni=self.cni,
            resolver=self.resolver,
            host=host.HostSnapshot.take(),
        )
        self._save_state()
        self.control_plane.up()
        if self.cni == "sluice" and self.resolver == "controller":
            self.kubectl("apply", "-f", str(POLICY_CRDS))
            self.kubectl("wait", "--for=condition=Established", "-f", str(POLICY_CRDS))
            self._start_on_host("sluice-controller", self._controller_argv())
        self.node_network.create()
        for index in range(1, self.node_count + 1):
            self._add_node(index)
        self._wait_nodes_ready()
        self._log(f"up in {time.monotonic() - started:.0f} s; KUBECONFIG={self.kubeconfig}")

    def _bpf_dir(self, index: int) -> Path:
        return Path("/sys/fs/bpf") / f"sluice-k8s-{self.name}-n{index}"

    def _add_node(self, index: int) -> Node:
        """Start node ``index`` until its network serves pods (Ready comes later)."""
        state = NodeState(
            index=index,
            name=f"{self.name}-n{index}",
            netns=self.node_network.node_netns(index),
            address=self.node_network.node_address(index),
            directory=str(self.directory / f"n{index}"),
            bpf_dir=str(self._bpf_dir(index)),
            cgroup_root=f"/sluice-k8s-{self.name}-n{index}",
        )
        self.state.nodes.append(state)
        self._save_state()
        node = Node(self, state)
        node.directory.mkdir()
        self.node_network.add_node(index)
        for client in ("kubelet", "kube-proxy", "sluice-agent"):
            shutil.copy2(self.kubeconfig_for(client), node.directory / f"{client}.kubeconfig")
        self._start_containerd(node)
        self._start_kubelet(node)
        self._install_cni(node)
        if self.routes == "static":
            self._static_routes()
        if self.cni == "sluice" and self.agent:
            self._start(node, "sluice-agent", self._agent_argv(node))
            self._wait(node.sluice_ready, f"sluicectl status on {node.name}", 120)
        self._start_kube_proxy(node)
        return node

    def _start_containerd(self, node: Node) -> None:
        containerd = node.containerd()
        containerd.start()
        assert containerd.pid is not None
        record = ProcessRecord(
            "containerd",
            containerd.pid,
            process_start_time(containerd.pid) or 0,
            ["containerd", "--config", str(containerd.config_path)],
            str(containerd.log_path),
        )
        node.state.processes["containerd"] = record
        self._save_state()
        for image in (PAUSE_IMAGE, AGNHOST_IMAGE):
            containerd.import_image(self.cache.image_tar(image), namespace=CRI_NAMESPACE)

    def _start_kubelet(self, node: Node) -> None:
        layout = node.layout()
        layout.kubelet_dir.mkdir()
        host.create_cgroups(layout.cgroup_root)
        config = components.kubelet_config(layout, "")
        del config["podCIDR"]  # the controller-manager's, from the Node object
        # Three kubelets share two CPUs: report status less often than the default 10 s.
        config["nodeStatusUpdateFrequency"] = "20s"
        config_file = components.write_json(layout.kubelet_dir / "config.json", config)
        self._start(node, "kubelet", components.kubelet_argv(layout, config_file))

        def pod_cidr() -> bool:
            proc = self.kubectl("get", "node", node.name, "-o", "json", check=False)
            if proc.returncode == 0:
                node.state.pod_cidr = json.loads(proc.stdout).get("spec", {}).get("podCIDR", "")
            return bool(node.state.pod_cidr)

        self._wait(pod_cidr, f"node {node.name} registered with a podCIDR", 120)
        self._save_state()

    def _install_cni(self, node: Node) -> None:
        node.cni_bin_dir.mkdir(parents=True, exist_ok=True)
        node.cni_conf_dir.mkdir(parents=True, exist_ok=True)  # containerd may have made it
        if self.cni == "ptp":
            for plugin in ("ptp", "host-local", "portmap", "loopback"):
                (node.cni_bin_dir / plugin).symlink_to(REFERENCE_PLUGINS / plugin)
            components.write_json(node.cni_conf_dir / "10-ptp.conflist", self.ptp_conf(node))
        else:
            node.sluice_state_dir.mkdir(parents=True)
            argv = [
                str(SLUICECTL),
                "install",
                f"--bin-dir={node.cni_bin_dir}",
                f"--conf-dir={node.cni_conf_dir}",
                f"--conf-name={node.sluice_conf.name}",
                f"--name={self.network}",
                f"--subnet={node.pod_cidr}",
                f"--cluster-cidr={CLUSTER_CIDR}",
                "--cni-version=1.0.0",  # containerd 1.6's libcni knows results up to 1.0.0
                "--policy=off",
                f"--state-dir={node.sluice_state_dir}",
                f"--bpf-dir={node.state.bpf_dir}",
                f"--agent-socket={node.agent_socket}",
                *self.install_args,  # later options win
            ]
            proc = node.run(argv)  # in the node: the pod MTU is its uplink's
            if proc.returncode != 0:
                raise ClusterError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
            (node.cni_bin_dir / LOOPBACK_PLUGIN.name).symlink_to(LOOPBACK_PLUGIN)
        node.containerd().wait_cri_ready(PAUSE_IMAGE, timeout=60)

    def ptp_conf(self, node: Node) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": node.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(node.directory / "host-local"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _static_routes(self) -> None:
        cidrs = {n.index: n.pod_cidr for n in self.state.nodes if n.pod_cidr}
        self.node_network.add_static_routes(cidrs)

    def _agent_argv(self, node: Node) -> list[str]:
        argv = [
            str(SLUICECTL),
            "agent",
            "--conf",
            str(node.sluice_conf),
            "--kubeconfig",
            str(node.directory / "sluice-agent.kubeconfig"),
            "--node-name",
            node.name,
        ]
        if self.resolver == "controller":
            argv += ["--resolver", "controller"]
        return argv

    def _controller_argv(self) -> list[str]:
        return [str(SLUICECTL), "controller", "--kubeconfig", str(self.kubeconfig_for("admin"))]

    def _start_kube_proxy(self, node: Node) -> None:
        layout = node.layout()
        config = components.kube_proxy_config(layout)
        config["clientConnection"] = {"kubeconfig": str(node.directory / "kube-proxy.kubeconfig")}
        config_file = components.write_json(node.directory / "kube-proxy.json", config)
        self._start(node, "kube-proxy", components.kube_proxy_argv(layout, config_file))

    def _wait_nodes_ready(self) -> None:
        names = {n.name for n in self.state.nodes}

        def all_ready() -> bool:
            listed = self.kubectl_json("get", "nodes")
            ready = set()
            for item in listed.get("items", []):
                conditions = item.get("status", {}).get("conditions", [])
                taints = item.get("spec", {}).get("taints") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and (
                    not any(t.get("effect") == "NoSchedule" for t in taints)
                ):
                    ready.add(item["metadata"]["name"])
            return names <= ready

        self._wait(all_ready, f"nodes {sorted(names)} Ready without NoSchedule taints", 180)
        for check in (
            ("serviceaccount", "default", "-n", "default"),
            ("configmap", "kube-root-ca.crt", "-n", "default"),
        ):
            self._wait(
                lambda check=check: self.kubectl("get", *check, check=False).returncode == 0,
                " ".join(check),
            )
        for node in self.nodes:

            def programmed(node: Node = node) -> bool:
                nat = node.run(["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"])
                return "default/kubernetes:https" in nat.stdout

            self._wait(programmed, f"kube-proxy on {node.name} to program the kubernetes Service")

    # --- processes ----------------------------------------------------------------------

    def _start(self, node: Node, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = self._daemons.start(name, in_netns(node.netns, list(argv)), node.log_path(name))
        node.state.processes[name] = record
        self._save_state()
        return record

    def _start_on_host(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = self._daemons.start(name, argv, self.directory / "logs" / f"{name}.log")
        self.state.processes[name] = record
        self._save_state()
        return record

    def _assert_running(self) -> None:
        for owner, processes in (
            ("host", self.state.processes),
            *((n.name, n.processes) for n in self.state.nodes),
        ):
            for record in processes.values():
                code = self._daemons.exited(record)
                if code is not None:
                    raise ClusterError(
                        f"{record.name} on {owner} exited ({code}); tail of {record.log}:\n"
                        f"{log_tail(record.log)}"
                    )

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        def check() -> bool:
            self._assert_running()
            return condition()

        wait_until(check, timeout=timeout, what=what, details=lambda: self.log_tails(15))

    def stop_process(self, node: Node, name: str) -> None:
        record = node.state.processes.pop(name, None)
        self._save_state()
        if record is not None:
            self._daemons.stop(record)

    def restart_agent(self, node: Node, argv: Sequence[str] | None = None) -> None:
        """Stop node's agent (its pinned datapath keeps enforcing) and start it again."""
        self.stop_process(node, "sluice-agent")
        self._start(node, "sluice-agent", list(argv or self._agent_argv(node)))
        self._wait(node.sluice_ready, f"sluicectl status on {node.name}", 120)

    def _save_state(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state.to_json(), indent=2) + "\n")
        tmp.replace(self.state_file)

    def _load_state(self) -> MultiNodeState | None:
        try:
            return MultiNodeState.from_json(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            raise ClusterError(f"{self.state_file} is unreadable: {exc}") from exc

    def _log(self, message: str) -> None:
        print(f"[k8s {self.name}] {message}", file=sys.stderr, flush=True)

    def log_tails(self, lines: int = 20) -> str:
        parts = [self.control_plane.log_tails(lines)]
        logs = sorted(self.directory.glob("logs/*.log")) + sorted(self.directory.glob("n*/logs/*"))
        parts += [
            f"--- {log.relative_to(self.directory)} ---\n{log_tail(log, lines)}" for log in logs
        ]
        for ctrd in sorted(self.directory.glob("n*/sluice-ctrd-*/containerd.log")):
            parts.append(f"--- {ctrd.relative_to(self.directory)} ---\n{log_tail(ctrd, lines)}")
        return "\n".join(p for p in parts if p)

    # --- nodes joining ----------------------------------------------------------------

    def add_node(self) -> Node:
        """One more node (the next index), Ready and with routes to and from it."""
        index = max((n.index for n in self.state.nodes), default=0) + 1
        node = self._add_node(index)
        self._wait_nodes_ready()
        return node

    # --- node removal and down ----------------------------------------------------------

    def remove_node(self, index: int, delete_node_object: bool = True) -> None:
        """Take node ``index`` away as a machine that dies would: its kubelet stops, its
        processes and namespace go, and (by default) its Node object is deleted. Static
        routes to it are removed from the other nodes; the agent removes its own."""
        node = self.node(index)
        self.stop_process(node, "kubelet")
        errors = self._teardown_node(node)
        if delete_node_object:
            self.kubectl("delete", "node", node.name, "--wait=true", timeout=120)
        if self.routes == "static" and node.pod_cidr:
            others = [n.index for n in self.state.nodes if n.index != index]
            self.node_network.remove_static_routes_to(index, node.pod_cidr, others)
        self.state.nodes = [n for n in self.state.nodes if n.index != index]
        self._save_state()
        if errors:
            raise ClusterError(f"node {node.name} teardown failed:\n" + "\n".join(errors))

    def _teardown_node(self, node: Node) -> list[str]:
        steps: list[tuple[str, Callable[[], object]]] = [
            ("stop kubelet", lambda: self._stop_record(node, "kubelet")),
            ("remove pods through CRI", lambda: self._remove_pods(node)),
            ("stop the sluice agent", lambda: self._stop_record(node, "sluice-agent")),
            ("stop kube-proxy", lambda: self._stop_record(node, "kube-proxy")),
            ("stop containerd", lambda: self._stop_containerd(node)),
            ("remove the namespace", lambda: self.node_network.remove_node(node.index)),
            ("remove the bpffs directory", lambda: shutil.rmtree(node.state.bpf_dir, True)),
            ("remove cgroups", lambda: host.remove_cgroups(node.state.cgroup_root)),
            ("unmount", lambda: unmount_all_under(node.directory)),
            ("keep logs", lambda: self._keep_node_logs(node)),
            ("remove the node directory", lambda: shutil.rmtree(node.directory, True)),
        ]
        errors = []
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(f"{node.name}: {what}: {exc}")
        return errors

    def _stop_record(self, node: Node, name: str) -> None:
        record = node.state.processes.get(name)
        if record is not None:
            self._daemons.stop(record)

    def _remove_pods(self, node: Node) -> None:
        record = node.state.processes.get("containerd")
        if record is None or not is_alive(record):
            return
        containerd = node.containerd()
        for pod in containerd.crictl("pods", "-q", check=False, timeout=30).stdout.split():
            containerd.remove_pod(pod, check=False)

    def _stop_containerd(self, node: Node) -> None:
        record = node.state.processes.get("containerd")
        if record is not None:
            self._daemons.stop(record)
        if node.containerd_base.exists():
            node.containerd().close()  # shims, mounts, its directory and cgroups

    def _keep_node_logs(self, node: Node) -> None:
        if self.keep_logs is None:
            return
        dest = self.keep_logs / node.name
        dest.mkdir(parents=True, exist_ok=True)
        for log in (node.directory / "logs").glob("*.log"):
            shutil.copy2(log, dest / log.name)
        containerd_log = node.containerd_base / "containerd.log"
        if containerd_log.exists():
            shutil.copy2(containerd_log, dest / "containerd.log")

    def down(self) -> list[str]:
        """Remove everything ``up`` created; return what could not be removed."""
        state = self._state or self._load_state()
        if state is None:
            if self.directory.exists():
                raise ClusterError(f"{self.directory} exists without a state file; remove it")
            if self.control_plane.is_up():
                return self.control_plane.down()
            return []
        self._state = state
        started = time.monotonic()
        errors: list[str] = []
        indexes = [n.index for n in state.nodes]
        for node in self.nodes:
            errors += self._teardown_node(node)
        steps: list[tuple[str, Callable[[], object]]] = [
            *(
                (f"stop {name}", lambda record=record: self._daemons.stop(record))
                for name, record in state.processes.items()
            ),
            ("remove the node network", lambda: self.node_network.remove(indexes)),
            ("remove libcni cache entries", lambda: remove_cni_cache_entries([self.network])),
            ("stop the control plane", self.control_plane.down),
            ("restore sysctls", lambda: host.restore_sysctls(state.host)),
            ("keep logs", self._keep_host_logs),
            ("remove the nodes' directory", lambda: shutil.rmtree(self.directory, True)),
            (
                "remove host directories",
                lambda: host.remove_created_paths(state.host, self.directory),
            ),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(f"{what}: {exc}")
        leftovers = self.leftovers(state, indexes)
        self._state = None
        self._log(f"down in {time.monotonic() - started:.0f} s")
        if errors:
            raise ClusterError(
                f"cluster {self.name} teardown failed:\n" + "\n".join(errors + leftovers)
            )
        return leftovers

    def _keep_host_logs(self) -> None:
        if self.keep_logs is None:
            return
        self.keep_logs.mkdir(parents=True, exist_ok=True)
        for log in self.directory.glob("logs/*.log"):
            shutil.copy2(log, self.keep_logs / log.name)

    def leftovers(self, state: MultiNodeState, indexes: list[int]) -> list[str]:
        found = [
            f"process {record.name} (pid {record.pid})"
            for record in [
                *state.processes.values(),
                *(r for n in state.nodes for r in n.processes.values()),
            ]
            if is_alive(record)
        ]
        found += [f"process {p}" for p in processes_mentioning(f"{self.directory}/")]
        found += self.node_network.leftovers(indexes)
        for index in indexes:
            if self._bpf_dir(index).exists():
                found.append(f"bpffs {self._bpf_dir(index)}")
            found += [f"cgroup {d}" for d in host.cgroup_dirs(f"/sluice-k8s-{self.name}-n{index}")]
        if self.directory.exists():
            found.append(f"directory {self.directory}")
        if self.control_plane.directory.exists():
            found.append(f"directory {self.control_plane.directory}")
        return found

    def status(self) -> dict[str, Any]:
        state = self.state
        nodes = self.kubectl("get", "nodes", "-o", "wide", check=False)
        return {
            "name": self.name,
            "kubeconfig": str(self.kubeconfig),
            "nodeNetwork": state.subnet,
            "routes": state.routes,
            "cni": state.cni,
            "resolver": state.resolver,
            "host": {name: is_alive(r) for name, r in state.processes.items()},
            "nodes": {
                n.name: {
                    "netns": n.netns,
                    "address": n.address,
                    "podCIDR": n.pod_cidr,
                    "bpfDir": n.bpf_dir,
                    "sluiceConf": str(Node(self, n).sluice_conf),
                    "processes": {name: is_alive(r) for name, r in n.processes.items()},
                }
                for n in state.nodes
            },
            "kubectl get nodes": nodes.stdout.strip() or nodes.stderr.strip(),
            "controlPlane": {
                name: is_alive(r) for name, r in self.control_plane.state.processes.items()
            },
        }


@contextlib.contextmanager
def running(cluster: MultiNodeCluster) -> Iterator[MultiNodeCluster]:
    """``cluster`` up for the block (what a crashed earlier session left torn down
    first), then down; nothing of a node may be left."""
    if cluster.is_up() or cluster.control_plane.is_up():
        cluster.down()
    cluster.up()
    try:
        yield cluster
    finally:
        leftovers = cluster.down()
        assert not leftovers, f"cluster {cluster.name} left behind: {leftovers}"
