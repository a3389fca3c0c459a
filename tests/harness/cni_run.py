"""Running the installed plugin the way a runtime does, and cleaning up after it."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni.net import link, masq
from cni.net.netlink import node_socket
from cni.plugin import podnet
from cni.spec.attachment import parse_alias
from cni.spec.invoke import Invocation, cni_env, invoke

PLUGIN_TIMEOUT = 60
SLUICECTL = Path(__file__).resolve().parent.parent.parent / ".venv" / "bin" / "sluicectl"
# One datapath for the whole test session (as on a node: one per node, shared by
# networks); the session fixture in conftest removes it at the end.
TEST_BPF_DIR = f"/sys/fs/bpf/slt-{os.getpid()}"
# Names carry a per-session tag, so that two test sessions on one machine never
# take each other's namespaces or networks for leftovers.
SESSION_TAG = f"{os.getpid() % 4096:03x}"
TEST_NETNS_PREFIX = f"slt-{SESSION_TAG}-"
TEST_NETWORK_PREFIX = f"slt{SESSION_TAG}"


def sluicectl(*args: object) -> subprocess.CompletedProcess[str]:
    """Run the operator CLI; the caller checks the exit code."""
    return subprocess.run(
        [SLUICECTL, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def preload_datapath(conflist: Path | str, timeout: float = 900) -> None:
    """Compile and pin the conflist's datapath before a test's first ADD, which would
    otherwise compile it within the plugin call's deadline (a minute and more on a
    loaded machine)."""
    proc = subprocess.run(
        [SLUICECTL, "datapath", "load", "--conf", str(conflist)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def exec_plugin(
    binary: Path | str,
    command: str,
    config: dict[str, Any] | bytes,
    *,
    container_id: str = "",
    netns: str = "",
    ifname: str = "",
    cni_args: str = "",
    cni_path: str = "",
    extra_env: dict[str, str] | None = None,
) -> Invocation:
    env = cni_env(
        command,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        cni_args=cni_args,
        cni_path=cni_path,
    )
    env.update(extra_env or {})
    return invoke(str(binary), env, config, timeout=PLUGIN_TIMEOUT)


@dataclass
class Network:
    """A sluice network under test: builds configs and runs verbs for it."""

    name: str
    subnet: str
    state_dir: Path
    bin_dir: Path
    cni_version: str = "1.1.0"

    def config(
        self, version: str | None = None, *, ipam: dict[str, Any] | None = None, **overrides: Any
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "cniVersion": version or self.cni_version,
            "name": self.name,
            "type": "sluice",
            "policy": "off",
            "stateDir": str(self.state_dir),
            "bpfDir": TEST_BPF_DIR,
            "ipam": ipam or {"type": "sluice-ipam", "subnet": self.subnet},
        }
        config.update(overrides)
        return config

    def run(
        self,
        command: str,
        config: dict[str, Any] | bytes | None = None,
        plugin: str = "sluice",
        **kwargs: Any,
    ) -> Invocation:
        kwargs.setdefault("cni_path", str(self.bin_dir))
        return exec_plugin(
            self.bin_dir / plugin, command, self.config() if config is None else config, **kwargs
        )

    def add(
        self,
        netns: str,
        container_id: str,
        ifname: str = "eth0",
        config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        run = self.run(
            "ADD", config, container_id=container_id, netns=netns, ifname=ifname, **kwargs
        ).ok()
        assert isinstance(run.out, dict), run.stdout
        return run.out

    def delete(
        self,
        netns: str,
        container_id: str,
        ifname: str = "eth0",
        config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Invocation:
        return self.run(
            "DEL", config, container_id=container_id, netns=netns, ifname=ifname, **kwargs
        )

    def check(
        self,
        netns: str,
        container_id: str,
        result: dict[str, Any],
        ifname: str = "eth0",
        **kwargs: Any,
    ) -> Invocation:
        config = self.config(result["cniVersion"], prevResult=result)
        return self.run(
            "CHECK", config, container_id=container_id, netns=netns, ifname=ifname, **kwargs
        )

    def veths(self) -> list[str]:
        with node_socket() as ipr:
            return [veth.name for veth in podnet.node_veths(ipr, self.name).values()]

    def allocations(self) -> dict[tuple[str, str], str]:
        """(container id, ifname) -> address, read straight from the store."""
        import sqlite3

        path = self.state_dir / "ipam" / f"{self.name}.db"
        if not path.exists():
            return {}
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT container_id, ifname, ip FROM allocations").fetchall()
        return {(cid, ifname): ip for cid, ifname, ip in rows}

    def masqueraded(self) -> set[str]:
        proc = subprocess.run(
            ["nft", "-j", "list", "set", "ip", masq.table_name(self.name), masq.SET],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            return set()
        for item in json.loads(proc.stdout)["nftables"]:
            if "set" in item:
                return {
                    e if isinstance(e, str) else e["elem"]["val"]
                    for e in item["set"].get("elem", [])
                }
        return set()

    def cleanup(self) -> None:
        with node_socket() as ipr:
            for veth in podnet.node_veths(ipr, self.name).values():
                link.delete_link(ipr, veth.name)
        masq.drop(self.name)


@dataclass
class PodNamespaces:
    """Named network namespaces standing in for pod sandboxes."""

    prefix: str
    created: list[str] = field(default_factory=list)

    def new(self) -> str:
        """Create one; return its path (what a runtime passes as CNI_NETNS)."""
        name = f"{self.prefix}{uuid.uuid4().hex[:10]}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.created.append(name)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        return f"/run/netns/{name}"

    def remove(self, path: str) -> None:
        name = Path(path).name
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        if name in self.created:
            self.created.remove(name)

    def cleanup(self) -> None:
        for name in list(self.created):
            self.remove(f"/run/netns/{name}")


def node_veth(result: dict[str, Any]) -> tuple[str, int]:
    """The node-side veth of an ADD result: (name, ifindex), the datapath's endpoint key."""
    name = result["interfaces"][0]["name"]
    return name, int(Path(f"/sys/class/net/{name}/ifindex").read_text())


def in_netns(
    path: str, *command: str, timeout: float = 20, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", Path(path).name, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def ping(path: str | None, address: str, count: int = 1) -> bool:
    command = ["ping", "-c", str(count), "-W", "2", "-i", "0.2", address]
    if path is None:
        proc = subprocess.run(command, capture_output=True, timeout=20, check=False)
    else:
        proc = in_netns(path, *command)
    return proc.returncode == 0


def leftover_links(network_prefix: str) -> list[str]:
    with node_socket() as ipr:
        found = []
        for msg in ipr.dump_links():
            owner = parse_alias(msg.get("IFLA_IFALIAS"))
            if owner and owner[0].startswith(network_prefix):
                found.append(msg.get("IFLA_IFNAME"))
        return found


def sluice_networks() -> list[str]:
    """Networks that have a masquerading table."""
    proc = subprocess.run(
        ["nft", "-j", "list", "tables", "ip"], capture_output=True, text=True, check=True
    )
    return [
        item["table"]["name"].removeprefix(masq.TABLE_PREFIX)
        for item in json.loads(proc.stdout)["nftables"]
        if "table" in item and item["table"]["name"].startswith(masq.TABLE_PREFIX)
    ]
