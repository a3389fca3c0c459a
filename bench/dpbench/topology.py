"""Two pods on this node wired by the real plugin, run as a runtime runs it
(cni.spec.invoke), with the benchmark's servers in the server pod."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cni.datapath import attach, endpoint_check
from cni.datapath.maps import Datapath
from cni.net.netlink import Rtnl
from cni.spec.invoke import cni_env, invoke
from dpbench import traffic
from dpbench.configs import BENCH_PORTS, CRR_PORT, IPERF_PORT, RR_PORT, SUBNET, Pod
from dpbench.plumbing import quietly, run, stop

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
REFERENCE = Path("/usr/lib/cni")


class Topology:
    def __init__(self, stack: contextlib.ExitStack, tag: str, work: Path, bpf_dir: str) -> None:
        self.stack = stack
        self.net = f"slbench{tag}"
        self.bpf_dir = bpf_dir
        self.work = work
        self.bin = work / "bin"
        self.server = Pod(f"slbench-{tag}-srv")
        self.client = Pod(f"slbench-{tag}-cli")
        self.config: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": self.net,
            "type": "sluice",
            "policy": "off",
            "ipMasq": False,
            "stateDir": str(work / "state"),
            "bpfDir": bpf_dir,
            "ipam": {"type": "sluice-ipam", "subnet": SUBNET},
        }

    @property
    def pods(self) -> tuple[Pod, Pod]:
        return self.server, self.client

    def install_plugins(self) -> None:
        run([VENV_BIN / "sluicectl", "install", "--bin-dir", self.bin,
             "--conf-dir", self.work / "net.d"])  # fmt: skip
        for plugin in ("host-local", "loopback"):
            (self.bin / plugin).symlink_to(REFERENCE / plugin)
        # The datapath's pins and the (unused with ipMasq off) nftables table go last.
        self.stack.callback(quietly, "remove the bpfDir", shutil.rmtree, self.bpf_dir)
        self.stack.callback(
            quietly,
            "delete the nftables table",
            run,
            ["nft", "delete", "table", "ip", f"sluice_{self.net}"],
            check=False,
        )

    def setup(self) -> None:
        self.install_plugins()
        started = time.monotonic()
        for pod in self.pods:
            self.add_pod(pod)
        print(
            f"pods wired in {time.monotonic() - started:.1f} s (includes the bcc compile): "
            f"server {self.server.ip} on {self.server.veth}, "
            f"client {self.client.ip} on {self.client.veth}",
            file=sys.stderr,
        )
        # A wide port range: CRR opens thousands of connections per measurement.
        run(["ip", "netns", "exec", self.client.name, "sysctl", "-qw",
             "net.ipv4.ip_local_port_range=1024 65535"])  # fmt: skip
        self.start_servers()

    def add_pod(self, pod: Pod) -> None:
        run(["ip", "netns", "add", pod.name])
        self.stack.callback(
            quietly, f"delete netns {pod.name}", run, ["ip", "netns", "del", pod.name]
        )
        run(["ip", "-n", pod.name, "link", "set", "lo", "up"])
        self.stack.callback(quietly, f"DEL {pod.name}", self.plugin, "DEL", pod)
        result = self.plugin("ADD", pod)
        pod.ip = str(ipaddress.ip_interface(result["ips"][0]["address"]).ip)
        pod.veth = result["interfaces"][0]["name"]
        pod.ifindex = int(Path(f"/sys/class/net/{pod.veth}/ifindex").read_text())

    def plugin(self, command: str, pod: Pod) -> Any:
        env = cni_env(
            command,
            container_id=f"bench-{pod.name}",
            netns=f"/run/netns/{pod.name}",
            ifname="eth0",
            cni_path=str(self.bin),
        )
        done = invoke(str(self.bin / "sluice"), env, self.config, timeout=120)
        if done.rc != 0:
            raise RuntimeError(f"sluice {command} {pod.name} failed: {done.stdout} {done.stderr}")
        return done.out

    def start_servers(self) -> None:
        for cmd in (
            ["iperf3", "-s", "-p", IPERF_PORT],
            [sys.executable, traffic.__file__, "_serve", RR_PORT, CRR_PORT],
        ):
            server = subprocess.Popen(
                ["ip", "netns", "exec", self.server.name, *map(str, cmd)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.stack.callback(quietly, f"stop {cmd[0]}", stop, server)
        deadline = time.monotonic() + 10
        while True:
            listing = run(["ip", "netns", "exec", self.server.name, "ss", "-Htln"]).stdout
            if all(f":{port} " in listing for port in BENCH_PORTS):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the servers do not listen on {BENCH_PORTS}: {listing}")
            time.sleep(0.1)

    def set_programs(self, attached: bool) -> None:
        """The sluice programs on both veths, or none (endpoint entries kept)."""
        with Rtnl() as ipr, Datapath(self.bpf_dir) as datapath:
            for pod in self.pods:
                if attached:
                    attach.attach_programs(datapath, ipr, pod.ifindex, pod.veth)
                else:
                    attach.detach_programs(datapath, ipr, pod.ifindex)

    def check_hooks(self, attached: bool) -> None:
        with Rtnl() as ipr, Datapath(self.bpf_dir) as datapath:
            for pod in self.pods:
                hooks = set(endpoint_check.attached_programs(datapath, ipr, pod.ifindex))
                if hooks != (set(attach.HOOKS) if attached else set()):
                    raise RuntimeError(f"{pod.veth} runs {sorted(hooks)}, attached={attached}")
