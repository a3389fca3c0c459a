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
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.harness import components, host
from tests.harness.cache import PAUSE_IMAGE, K8sCache
from tests.harness.cluster import DEFAULT_RUN_DIR, NAME_RE, PORT_BASE_ENV, RUN_DIR_ENV, Cluster
from tests.harness.cluster_lifecycle import ClusterLifecycle
from tests.harness.cluster_state import (
    ClusterError,
    MultiNodeState,
    NodeState,
)
from tests.harness.components import ClusterLayout, Ports
from tests.harness.containerd import PrivateContainerd, remove_cni_cache_entries, unmount_all_under
from tests.harness.host_facts import host_routes, processes_mentioning
from tests.harness.node_layout import CLUSTER_CIDR, SERVICE_CIDR, SLUICECTL, NodeHandle, NodeLayout
from tests.harness.node_network import NodeNetwork
from tests.harness.node_processes import (
    NodeProcesses,
    assert_running,
    run_steps,
    schedulable,
    wait_serving,
)
from tests.harness.processes import Daemons, ProcessRecord, is_alive, log_tail

DEFAULT_PORT_BASE = 25000
DEFAULT_NAME = "multi"
REFERENCE_PLUGINS = Path("/usr/lib/cni")
POLICY_CRDS = Path(__file__).resolve().parents[2] / "conf" / "policyendpoints.yaml"
ROUTES = ("static", "agent")
CNIS = ("sluice", "ptp")
RESOLVERS = ("agent", "controller")


class Node(NodeHandle):
    """One node of the cluster: paths and clients (its processes are in the state)."""

    def __init__(self, cluster: MultiNodeCluster, state: NodeState) -> None:
        self.cluster = cluster
        self.state = state
        directory = Path(state.directory)
        self.layout = NodeLayout(
            directory=directory,
            containerd_base=directory / f"sluice-ctrd-{cluster.name}-n{state.index}",
            network=cluster.network,
            bpf_dir=Path(state.bpf_dir),
            cgroup_root=state.cgroup_root,
            netns=state.netns,
        )

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
        return self.layout.directory

    def components(self) -> ClusterLayout:
        """What the flags of the node's kubelet and kube-proxy are made of."""
        return self.layout.components(
            self.cluster.cache, self.cluster.ports, self.name, self.address
        )

    def containerd(self) -> PrivateContainerd:
        return self.layout.containerd()


class MultiNodeCluster(ClusterLifecycle[MultiNodeState]):
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
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def kubeconfig_for(self, client: str) -> Path:
        return self.control_plane.kubeconfig_for(client)

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

    # --- up ---------------------------------------------------------------------------

    def _parse_state(self, data: dict[str, Any]) -> MultiNodeState:
        return MultiNodeState.from_json(data)

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
            shutil.copy2(self.kubeconfig_for(client), node.layout.kubeconfig(client))
        processes = self._processes(node)
        processes.start_containerd(node.containerd())
        self._start_kubelet(node, processes)
        self._install_cni(node, processes)
        if self.routes == "static":
            self._static_routes()
        if self.cni == "sluice" and self.agent:
            processes.start_agent(self._agent_argv(node), node.name)
        processes.start_kube_proxy(node.components())
        return node

    def _processes(self, node: Node) -> NodeProcesses:
        """The node's processes, recorded in the state file."""
        return NodeProcesses(
            node.layout,
            node.state.processes,
            self._save_state,
            self._daemons,
            self._wait,
            self.cache,
        )

    def _start_kubelet(self, node: Node, processes: NodeProcesses) -> None:
        layout = node.components()
        config = components.kubelet_config(layout, "")
        del config["podCIDR"]  # the controller-manager's, from the Node object
        # Three kubelets share two CPUs: report status less often than the default 10 s.
        config["nodeStatusUpdateFrequency"] = "20s"
        node.state.pod_cidr = processes.start_kubelet(layout, config, self.kubectl, 120)
        self._save_state()

    def _install_cni(self, node: Node, processes: NodeProcesses) -> None:
        if self.cni == "ptp":
            node.cni_bin_dir.mkdir(parents=True, exist_ok=True)
            node.cni_conf_dir.mkdir(parents=True, exist_ok=True)  # containerd may have made it
            for plugin in ("ptp", "host-local", "portmap", "loopback"):
                (node.cni_bin_dir / plugin).symlink_to(REFERENCE_PLUGINS / plugin)
            components.write_json(node.cni_conf_dir / "10-ptp.conflist", self.ptp_conf(node))
        else:
            processes.install_sluice(node.pod_cidr, self.install_args)
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
        argv = node.layout.agent_argv(node.name)
        if self.resolver == "controller":
            argv += ["--resolver", "controller"]
        return argv

    def _controller_argv(self) -> list[str]:
        return [str(SLUICECTL), "controller", "--kubeconfig", str(self.kubeconfig_for("admin"))]

    def _wait_nodes_ready(self) -> None:
        names = {n.name for n in self.state.nodes}

        def all_ready() -> bool:
            listed = self.kubectl_json("get", "nodes")
            ready = {i["metadata"]["name"] for i in listed.get("items", []) if schedulable(i)}
            return names <= ready

        self._wait(all_ready, f"nodes {sorted(names)} Ready without NoSchedule taints", 180)
        wait_serving(self._wait, self.kubectl, {n.name: self._processes(n) for n in self.nodes})

    # --- processes ----------------------------------------------------------------------

    def _start_on_host(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = self._daemons.start(name, argv, self.directory / "logs" / f"{name}.log")
        self.state.processes[name] = record
        self._save_state()
        return record

    def _assert_running(self) -> None:
        assert_running(self._daemons, self.state.processes, " on host")
        for node in self.state.nodes:
            assert_running(self._daemons, node.processes, f" on {node.name}")

    def stop_process(self, node: Node, name: str) -> None:
        self._processes(node).withdraw(name)

    def restart_agent(self, node: Node, argv: Sequence[str] | None = None) -> None:
        """Stop node's agent (its pinned datapath keeps enforcing) and start it again."""
        processes = self._processes(node)
        processes.withdraw("sluice-agent")
        processes.start_agent(list(argv or self._agent_argv(node)), node.name)

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
        processes = self._processes(node)
        steps = [
            *processes.stop_steps(
                lambda: node.containerd() if node.containerd_base.exists() else None
            ),
            ("remove the namespace", lambda: self.node_network.remove_node(node.index)),
            ("remove the bpffs directory", lambda: shutil.rmtree(node.state.bpf_dir, True)),
            ("remove cgroups", lambda: host.remove_cgroups(node.state.cgroup_root)),
            ("unmount", lambda: unmount_all_under(node.directory)),
            ("keep logs", lambda: self._keep_node_logs(processes, node.name)),
            ("remove the node directory", lambda: shutil.rmtree(node.directory, True)),
        ]
        return [f"{node.name}: {error}" for error in run_steps(steps)]

    def _keep_node_logs(self, processes: NodeProcesses, name: str) -> None:
        if self.keep_logs is not None:
            processes.keep_logs(self.keep_logs / name)

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
        errors += run_steps(steps)
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
