"""A test cluster's node: its layout, its processes' bookkeeping, its state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.cache import K8sCache
from tests.harness.cluster import Cluster, sluice_agent_argv
from tests.harness.cluster_state import (
    ClusterError,
    MultiNodeState,
    NodeState,
    read_state,
    write_state,
)
from tests.harness.components import Ports
from tests.harness.host import HostSnapshot
from tests.harness.multinode import MultiNodeCluster, Node
from tests.harness.node_layout import SLUICECTL, NodeLayout
from tests.harness.node_processes import NodeProcesses, run_steps, schedulable
from tests.harness.processes import Daemons, ProcessRecord


def node_state(run_dir: Path, index: int = 1) -> NodeState:
    return NodeState(
        index=index,
        name=f"m-n{index}",
        netns=f"slk-m-n{index}",
        address=f"172.31.25.{10 + index}",
        directory=str(run_dir / "m-nodes" / f"n{index}"),
        bpf_dir=f"/sys/fs/bpf/sluice-k8s-m-n{index}",
        cgroup_root=f"/sluice-k8s-m-n{index}",
    )


def test_a_single_node_and_a_node_of_several_are_laid_out_alike(tmp_path: Path) -> None:
    cache = K8sCache(tmp_path / "cache")
    single = Cluster("s", cache=cache, run_dir=tmp_path)
    node = Node(MultiNodeCluster("m", cache=cache, run_dir=tmp_path), node_state(tmp_path))
    for handle, directory, ctrd in (
        (single, tmp_path / "s", "sluice-ctrd-s"),
        (node, tmp_path / "m-nodes" / "n1", "sluice-ctrd-m-n1"),
    ):
        assert handle.cni_bin_dir == directory / "cni" / "bin"
        assert handle.cni_conf_dir == directory / "cni" / "net.d"
        assert handle.sluice_conf == directory / "cni" / "net.d" / "10-sluice.conflist"
        assert handle.sluice_state_dir == directory / "sluice" / "state"
        assert handle.agent_socket == directory / "sluice" / "agent.sock"
        assert handle.containerd_base == directory / ctrd
        assert handle.log_path("kubelet") == directory / "logs" / "kubelet.log"
    assert single.layout.netns is None and node.layout.netns == "slk-m-n1"
    assert single.layout.bpf_dir == Path("/sys/fs/bpf/sluice-k8s-s")
    assert (single.layout.network, node.layout.network) == ("k8s-s", "k8s-m")


def test_install_puts_the_test_defaults_first_so_later_options_win(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path, tmp_path / "sluice-ctrd-x", "k8s-x", Path("/b"), "/cg")
    argv = layout.sluice_install_argv("10.244.3.0/24", ["--policy=enforce"])
    assert argv[:2] == [str(SLUICECTL), "install"]
    assert "--subnet=10.244.3.0/24" in argv and "--cluster-cidr=10.244.0.0/16" in argv
    assert argv.index("--policy=off") < argv.index("--policy=enforce") == len(argv) - 1
    assert f"--agent-socket={tmp_path / 'sluice' / 'agent.sock'}" in argv


def test_node_commands_run_in_the_nodes_namespace(tmp_path: Path) -> None:
    host = NodeLayout(tmp_path, tmp_path / "sluice-ctrd-x", "k8s-x", Path("/b"), "/cg")
    node = NodeLayout(tmp_path, tmp_path / "sluice-ctrd-x", "k8s-x", Path("/b"), "/cg", "ns1")
    assert host.command(["ip", tmp_path]) == ["ip", str(tmp_path)]
    assert node.command(["ip"]) == ["nsenter", "--net=/run/netns/ns1", "--", "ip"]
    agent = node.agent_argv("n1")
    assert agent[agent.index("--kubeconfig") + 1] == str(tmp_path / "sluice-agent.kubeconfig")
    assert agent[-2:] == ["--node-name", "n1"]


def test_the_standard_agent_argv_names_the_single_nodes_files(tmp_path: Path) -> None:
    cluster = Cluster("s", cache=K8sCache(tmp_path / "cache"), run_dir=tmp_path)
    argv = sluice_agent_argv(cluster)
    assert argv[1:5] == ["agent", "--conf", str(cluster.sluice_conf), "--kubeconfig"]
    assert argv[5] == str(cluster.kubeconfig_for("sluice-agent"))


def test_components_of_a_node_take_its_name_address_and_socket(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path, tmp_path / "sluice-ctrd-x", "k8s-x", Path("/b"), "/cg")
    components = layout.components(K8sCache(tmp_path), Ports(25000), "n1", "192.0.2.9")
    assert components.directory == tmp_path and components.node_name == "n1"
    assert components.containerd_socket == tmp_path / "sluice-ctrd-x" / "containerd.sock"
    assert (components.cluster_cidr, components.node_cidr_mask) == ("10.244.0.0/16", 24)


class RecordingDaemons(Daemons):
    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, list[str], Path]] = []
        self.stopped: list[str] = []

    def start(self, name, argv, log_path, *, env=None):  # type: ignore[no-untyped-def]
        self.started.append((name, [str(a) for a in argv], log_path))
        return ProcessRecord(name, 100 + len(self.started), 1, [str(a) for a in argv], "")

    def stop(self, record: ProcessRecord, timeout: float = 15.0) -> None:
        self.stopped.append(record.name)


def test_a_started_process_is_recorded_and_saved_before_anything_waits(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path, tmp_path / "sluice-ctrd-x", "k8s-x", Path("/b"), "/cg", "ns1")
    records: dict[str, ProcessRecord] = {}
    saved: list[list[str]] = []
    daemons = RecordingDaemons()
    processes = NodeProcesses(
        layout,
        records,
        lambda: saved.append(sorted(records)),
        daemons,
        lambda condition, what, timeout: None,
        K8sCache(tmp_path),
    )
    processes.start("kube-proxy", ["kube-proxy", "--v=1"])
    assert daemons.started == [
        (
            "kube-proxy",
            ["nsenter", "--net=/run/netns/ns1", "--", "kube-proxy", "--v=1"],
            tmp_path / "logs" / "kube-proxy.log",
        )
    ]
    assert saved == [["kube-proxy"]]
    processes.start("kubelet", ["kubelet"])
    for what, step in processes.stop_steps(lambda: None):
        if what != "remove pods through CRI":
            step()
    assert daemons.stopped == ["kubelet", "kube-proxy"]  # nothing else ran
    assert set(records) == {"kubelet", "kube-proxy"}  # kept for ``leftovers``
    processes.withdraw("kubelet")
    assert set(records) == {"kube-proxy"} and saved[-1] == ["kube-proxy"]


def test_every_teardown_step_runs_after_one_failed() -> None:
    ran: list[str] = []

    def fail() -> None:
        raise OSError("busy")

    errors = run_steps([("first", fail), ("second", lambda: ran.append("second"))])
    assert errors == ["first: busy"] and ran == ["second"]


def test_a_node_is_schedulable_when_ready_and_without_no_schedule_taints() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert schedulable(ready)
    assert not schedulable({**ready, "spec": {"taints": [{"effect": "NoSchedule"}]}})
    assert schedulable({**ready, "spec": {"taints": None}})
    assert not schedulable({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})


def test_multi_node_state_round_trips_through_its_file(tmp_path: Path) -> None:
    state = MultiNodeState(
        name="m",
        prefix="slk-m",
        subnet="172.31.25.0/24",
        routes="agent",
        cni="sluice",
        resolver="controller",
        host=HostSnapshot([], ["/var/lib/kubelet"], {}),
        nodes=[node_state(tmp_path)],
        processes={"sluice-controller": ProcessRecord("sluice-controller", 5, 6, ["x"], "/l")},
    )
    path = tmp_path / "state.json"
    assert read_state(path, MultiNodeState.from_json) is None
    write_state(path, state.to_json())
    assert read_state(path, MultiNodeState.from_json) == state
    path.write_text("{")
    with pytest.raises(ClusterError, match="unreadable"):
        read_state(path, MultiNodeState.from_json)
