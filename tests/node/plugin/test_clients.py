"""Real CNI clients and chaining partners: cnitool, portmap, bandwidth, ptp.

cnitool is the reference library's own client (libcni, spec 1.1.0); it is
installed by `make tools` from the Go module proxy. Debian's portmap,
bandwidth and ptp speak spec versions up to 1.0.0.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cni_run import Network, PodNamespaces, in_netns, ping
from tests.harness.host import IPTABLES
from tests.harness.probes import node_address

ROOT = Path(__file__).resolve().parents[3]
CNI_CACHE = Path("/var/lib/cni/results")


def find_cnitool() -> str | None:
    local = ROOT / ".tools" / "bin" / "cnitool"
    return str(local) if local.exists() else shutil.which("cnitool")


@pytest.fixture
def cnitool(network: Network, tmp_path: Path) -> Iterator[Any]:
    binary = find_cnitool()
    if binary is None:
        # Only a machine without Go may lack it: everywhere else `make tools` builds it.
        if shutil.which("go"):
            pytest.fail("cnitool is missing although Go is installed: run `make tools`")
        pytest.skip("cnitool is not installed and there is no Go to build it")
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    cache_existed = CNI_CACHE.parent.exists()

    def run(
        command: str, netns: str, conflist: dict[str, Any], cap_args: Any = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        (conf_dir / "10-test.conflist").write_text(json.dumps(conflist))
        env = {
            "PATH": os.environ["PATH"],
            "NETCONFPATH": str(conf_dir),
            "CNI_PATH": str(network.bin_dir),
        }
        if cap_args is not None:
            env["CAP_ARGS"] = json.dumps(cap_args)
        proc = subprocess.run(
            [binary, command, network.name, netns],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"cnitool {command}: {proc.stdout} {proc.stderr}"
        return proc

    try:
        yield run
    finally:
        for entry in CNI_CACHE.glob(f"{network.name}-*"):
            entry.unlink()
        if not cache_existed:  # libcni created /var/lib/cni for us: take it away again
            shutil.rmtree(CNI_CACHE.parent, ignore_errors=True)


def _nat_rules(iptables: str) -> list[str]:
    out = subprocess.run([iptables, "-w", "-t", "nat", "-S"], capture_output=True, text=True)
    return out.stdout.splitlines()


def _hostport_chains(iptables: str) -> set[str]:
    return {line.split()[1] for line in _nat_rules(iptables) if line.startswith("-N CNI-HOSTPORT-")}


@pytest.fixture
def nat_tables_restored() -> Iterator[None]:
    """portmap (through iptables-nft) creates its CNI-HOSTPORT-* chains, hooked into
    the nat table (made on first use), and never removes them: whatever of these was
    not there before goes afterwards, also when the table was there already (the
    host's kube-proxy of the session's test cluster makes it)."""

    def tables() -> set[str]:
        out = subprocess.run(
            ["nft", "list", "tables"], capture_output=True, text=True, check=True
        ).stdout
        return {line.removeprefix("table ").strip() for line in out.splitlines()}

    before = tables()
    chains_before = {iptables: _hostport_chains(iptables) for iptables in IPTABLES}
    try:
        yield
    finally:
        for iptables, existed in chains_before.items():
            new = _hostport_chains(iptables) - existed
            for line in _nat_rules(iptables):  # the jumps into them from the hooks
                words = shlex.split(line)
                if words[0] == "-A" and any(f"-j {chain}" in line for chain in new):
                    subprocess.run([iptables, "-w", "-t", "nat", "-D", *words[1:]], check=False)
            for flag in ("-F", "-X"):
                for chain in sorted(new):
                    subprocess.run([iptables, "-w", "-t", "nat", flag, chain], check=False)
        for table in tables() - before:
            if table in ("ip nat", "ip6 nat", "ip filter", "ip6 filter"):
                subprocess.run(["nft", "delete", "table", *table.split()], check=False)


def conflist(
    network: Network, version: str, *chained: dict[str, Any], **plugin: Any
) -> dict[str, Any]:
    sluice = network.config(version, **plugin)
    for key in ("cniVersion", "name"):
        del sluice[key]
    return {"cniVersion": version, "name": network.name, "plugins": [sluice, *chained]}


def test_cnitool_add_check_status_del_gc(
    network: Network, pods: PodNamespaces, cnitool: Any
) -> None:
    config = conflist(network, "1.1.0")
    ns_a, ns_b = pods.new(), pods.new()
    result = json.loads(cnitool("add", ns_a, config).stdout)
    assert result["cniVersion"] == "1.1.0"
    ip_a = result["ips"][0]["address"].split("/")[0]
    assert ping(None, ip_a)
    cnitool("check", ns_a, config)
    cnitool("status", ns_a, config)
    cnitool("del", ns_a, config)
    cnitool("del", ns_a, config)  # DEL again: still fine
    assert network.allocations() == {} and network.veths() == []

    cnitool("add", ns_a, config)
    cnitool("add", ns_b, config)
    assert len(network.allocations()) == 2
    pods.remove(ns_b)  # the sandbox vanished without a DEL
    # cnitool gc DELs every cached attachment, then sends GC with no valid ones.
    cnitool("gc", ns_a, config)
    assert network.allocations() == {} and network.veths() == []
    assert network.masqueraded() == set()


def test_cnitool_passes_capability_args(
    network: Network, pods: PodNamespaces, cnitool: Any
) -> None:
    config = conflist(network, "1.1.0", capabilities={"mac": True})
    netns = pods.new()
    result = json.loads(cnitool("add", netns, config, cap_args={"mac": "02:aa:bb:cc:dd:ee"}).stdout)
    assert result["interfaces"][1]["mac"] == "02:aa:bb:cc:dd:ee"
    cnitool("del", netns, config, cap_args={"mac": "02:aa:bb:cc:dd:ee"})


TCP_ECHO = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen()
print("ready", flush=True)
conn, peer = s.accept()
conn.sendall(b"pong from pod")
conn.close()
"""


def reaches_pod_through(netns: str, host_port: int) -> bool:
    """A connection to the node's hostPort gets the pod's echo server."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", Path(netns).name, "/usr/bin/python3", "-c", TCP_ECHO],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        for _ in range(20):  # give the DNAT rules a moment
            try:
                with socket.create_connection((node_address(), host_port), timeout=3) as conn:
                    return conn.recv(100) == b"pong from pod"
            except OSError:
                time.sleep(0.2)
        return False
    finally:
        server.kill()
        server.wait()


@pytest.mark.usefixtures("nat_tables_restored")
def test_chain_with_portmap_and_bandwidth(
    network: Network, pods: PodNamespaces, cnitool: Any
) -> None:
    config = conflist(
        network,
        "1.0.0",
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    )
    host_port = 30000 + os.getpid() % 20000
    cap_args = {
        "portMappings": [{"hostPort": host_port, "containerPort": 8080, "protocol": "tcp"}],
        "bandwidth": {
            "ingressRate": 100_000_000,
            "ingressBurst": 1_000_000,
            "egressRate": 100_000_000,
            "egressBurst": 1_000_000,
        },
    }
    netns = pods.new()
    try:
        result = json.loads(cnitool("add", netns, config, cap_args=cap_args).stdout)
        host_veth = result["interfaces"][0]["name"]
        # bandwidth shapes the node-side veth it found in sluice's result; its ingress
        # qdisc sits beside sluice's tcx programs.
        qdiscs = subprocess.run(
            ["tc", "qdisc", "show", "dev", host_veth], capture_output=True, text=True, check=True
        ).stdout
        assert "tbf" in qdiscs and "ingress" in qdiscs, qdiscs
        assert reaches_pod_through(netns, host_port)
    finally:
        # A failed ADD leaves the chain half-done; the runtime's DEL undoes it (in
        # reverse order). No CHECK here: Debian's portmap 1.1.1 fails its own CHECK
        # on an IPv4-only pod ("could not check ipv6 dnat: chain CNI-DN-… not found").
        deleted = cnitool("del", netns, config, cap_args=cap_args, check=False)
    assert deleted.returncode == 0, deleted.stderr
    assert network.veths() == [] and network.allocations() == {}
    rules = subprocess.run(
        ["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True
    ).stdout
    assert f"dport {host_port}" not in rules and f"--dport {host_port}" not in rules


def test_ptp_with_sluice_ipam(network: Network, pods: PodNamespaces) -> None:
    """Debian's ptp delegates its addresses to sluice-ipam instead of host-local."""
    config = {
        "cniVersion": "1.0.0",
        "name": network.name,
        "type": "ptp",
        "ipMasq": False,
        "ipam": {
            "type": "sluice-ipam",
            "subnet": network.subnet,
            "stateDir": str(network.state_dir),
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }
    netns = pods.new()
    run = network.run(
        "ADD", config, plugin="ptp", container_id="p1", netns=netns, ifname="eth0"
    ).ok()
    address = run.out["ips"][0]["address"]
    gateway = run.out["ips"][0]["gateway"]
    assert address.endswith("/24") and gateway == network.subnet.replace(".0/24", ".1")
    assert network.allocations() == {("p1", "eth0"): address.split("/")[0]}
    assert ping(netns, gateway)
    assert address in in_netns(netns, "ip", "-4", "addr", "show", "eth0").stdout
    check = dict(config, prevResult=run.out)
    network.run("CHECK", check, plugin="ptp", container_id="p1", netns=netns, ifname="eth0").ok()
    network.run("DEL", config, plugin="ptp", container_id="p1", netns=netns, ifname="eth0").ok()
    assert network.allocations() == {}
