"""sluicectl ipam show / gc / check, and prefix mode through the plugin."""

from __future__ import annotations

import ipaddress
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from ipam.claims import BlockUsage, LocalClaimStore
from ipam.space import free_in_block
from tests.harness.cni_run import Network, PodNamespaces, ping, sluicectl


def write_conflist(network: Network, tmp_path: Path, plugin: dict[str, Any]) -> Path:
    plugin = {k: v for k, v in plugin.items() if k not in ("name", "cniVersion")}
    path = tmp_path / "net.conflist"
    conflist = {"cniVersion": "1.1.0", "name": network.name, "plugins": [plugin]}
    path.write_text(json.dumps(conflist))
    return path


def prefix_ipam(tmp_path: Path, pool: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "sluice-ipam",
        "mode": "prefix",
        "pool": pool,
        "claimsDir": str(tmp_path / "claims"),
        "nodeName": "node-a",
        **extra,
    }


def test_prefix_mode_through_the_plugin(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    ipam = prefix_ipam(tmp_path, "10.31.0.0/24")
    config = network.config(ipam=ipam)
    ns_a, ns_b = pods.new(), pods.new()
    result = network.add(ns_a, "a", config=config)
    address = result["ips"][0]["address"]
    assert address == "10.31.0.0/32" and result["ips"][0]["gateway"] == "169.254.1.1"
    ip_b = network.add(ns_b, "b", config=config)["ips"][0]["address"].split("/")[0]
    assert ping(ns_a, ip_b)
    assert network.masqueraded() == {"10.31.0.0", ip_b}  # clusterCIDR defaults to the pool
    network.check(ns_a, "a", result).ok()

    shown = json.loads(
        sluicectl(
            "ipam", "show", "--conf", write_conflist(network, tmp_path, config), "-o", "json"
        ).stdout
    )
    (net,) = shown["networks"]
    assert net["mode"] == "prefix" and net["pool"] == "10.31.0.0/24"
    assert net["prefixLength"] == 28 and net["node"] == "node-a"
    assert [p["cidr"] for p in net["prefixes"]] == ["10.31.0.0/28", "10.31.0.16/28"]
    assert net["prefixes"][0] == {"cidr": "10.31.0.0/28", "used": 2, "cooling": 0, "free": 14}
    assert net["stats"]["prefixesHeld"] == 2 and net["stats"]["prefixesMinimum"] == 1
    assert net["stats"]["packing"] == 2.0
    assert net["stats"]["freeAlignedBlocks"] == 14
    assert net["stats"]["largestFreeBlock"] == "10.31.0.128/25"
    for netns, cid in ((ns_a, "a"), (ns_b, "b")):
        network.delete(netns, cid, config=config).ok()
    assert network.allocations() == {}


def test_a_fragmented_pool_fails_add_and_status_clearly(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    # Another node holds both /28 blocks of the pool and uses 3 addresses in each.
    ipam = prefix_ipam(tmp_path, "10.31.1.0/27", warmPrefixes=0)
    other = LocalClaimStore(str(tmp_path / "claims"), ipaddress.IPv4Network("10.31.1.0/27"), 28)
    blocks = [other.claim("node-b", network.name) for _ in range(2)]
    other.report_usage(
        "node-b",
        {b: BlockUsage(3, free_in_block(b, list(b)[:3])) for b in blocks if b},
    )
    other.close()
    config = network.config(ipam=ipam)
    run = network.run("ADD", config, container_id="c1", netns=pods.new(), ifname="eth0")
    message = (
        "pool 10.31.1.0/27 has 26 free addresses but no free aligned /28 "
        "(the largest free aligned block is 10.31.1.8/29)"
    )
    assert run.error_code == 102 and run.out["details"] == message
    run = network.run("STATUS", config)
    assert run.error_code == 50 and run.out["details"] == message
    assert network.veths() == [] and network.allocations() == {}


def test_show_table_and_state_dir(network: Network, pods: PodNamespaces, tmp_path: Path) -> None:
    netns = pods.new()
    network.add(netns, "c1", cni_args="K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0")
    conf = write_conflist(network, tmp_path, network.config())
    table = sluicectl("ipam", "show", "--conf", conf)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"network {network.name}  mode node-cidr  {network.subnet}"
    assert "allocated 1  free 252" in lines[1] and "largest free block" in lines[1]
    assert "shop/cart-0" in table.stdout
    by_dir = json.loads(
        sluicectl("ipam", "show", "--state-dir", network.state_dir, "-o", "json").stdout
    )
    (net,) = by_dir["networks"]
    assert net["name"] == network.name and net["subnet"] == network.subnet
    (allocation,) = net["allocations"]
    assert set(allocation) >= {"containerID", "ifname", "ip", "allocatedAt"}
    assert net["stats"]["allocated"] == 1 and net["stats"]["packing"] is None
    network.delete(netns, "c1").ok()
    cooled = json.loads(
        sluicectl("ipam", "show", "--state-dir", network.state_dir, "-o", "json").stdout
    )["networks"][0]
    assert [c["ip"] for c in cooled["cooling"]] == [allocation["ip"]]


def test_ipam_gc_command(network: Network, pods: PodNamespaces, tmp_path: Path) -> None:
    conf = write_conflist(network, tmp_path, network.config())
    ns = {cid: pods.new() for cid in ("keep", "drop")}
    for cid, netns in ns.items():
        network.add(netns, cid)
    assert sluicectl("ipam", "gc", "--conf", conf).returncode != 0  # says what it needs
    dry = sluicectl("ipam", "gc", "--conf", conf, "--valid", "keep", "--dry-run")
    assert "would release" in dry.stdout and "drop/eth0" in dry.stdout
    assert len(network.allocations()) == 2
    done = sluicectl("ipam", "gc", "--conf", conf, "--valid", "keep/eth0")
    assert done.returncode == 0, done.stderr
    assert list(network.allocations()) == [("keep", "eth0")]
    assert len(network.veths()) == 1  # the plugin's GC also removed drop's veth
    network.delete(ns["keep"], "keep").ok()


def test_ipam_check_finds_and_repairs_leaks(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    conf = write_conflist(network, tmp_path, network.config())
    ns = {cid: pods.new() for cid in ("ok", "leaked", "orphan")}
    results = {cid: network.add(netns, cid) for cid, netns in ns.items()}
    clean = sluicectl("ipam", "check", "--conf", conf)
    assert clean.returncode == 0 and "no problem found" in clean.stdout

    # "leaked": its veth vanished (an old allocation, past the grace period);
    # "orphan": its allocation vanished.
    subprocess.run(["ip", "link", "del", results["leaked"]["interfaces"][0]["name"]], check=True)
    db = network.state_dir / "ipam" / f"{network.name}.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE allocations SET allocated_at = 0, boot_id = '' WHERE container_id = 'leaked'"
        )
        conn.execute("DELETE FROM allocations WHERE container_id = 'orphan'")
    found = json.loads(sluicectl("ipam", "check", "--conf", conf, "-o", "json").stdout)
    kinds = {f["kind"]: f["detail"] for f in found["findings"]}
    assert set(kinds) == {"allocation-without-veth", "veth-without-allocation"}
    assert "leaked/eth0" in kinds["allocation-without-veth"]
    assert "orphan/eth0" in kinds["veth-without-allocation"]

    repaired = sluicectl("ipam", "check", "--conf", conf, "--repair")
    assert repaired.returncode == 0, repaired.stdout
    assert repaired.stdout.count("(repaired)") == 2
    assert list(network.allocations()) == [("ok", "eth0")]
    assert len(network.veths()) == 1
    orphan_ip = results["orphan"]["ips"][0]["address"].split("/")[0]
    assert orphan_ip not in network.masqueraded()
    assert sluicectl("ipam", "check", "--conf", conf).returncode == 0
    network.delete(ns["ok"], "ok").ok()


def test_bridge_with_sluice_ipam(network: Network, pods: PodNamespaces) -> None:
    """Debian's bridge plugin delegates its addresses to sluice-ipam."""
    bridge = f"slb{network.name[-8:]}"
    config = {
        "cniVersion": "1.0.0",
        "name": network.name,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipam": {
            "type": "sluice-ipam",
            "subnet": network.subnet,
            "stateDir": str(network.state_dir),
        },
    }
    ns_a, ns_b = pods.new(), pods.new()
    try:
        runs = [
            network.run(
                "ADD", config, plugin="bridge", container_id=cid, netns=netns, ifname="eth0"
            ).ok()
            for cid, netns in (("a", ns_a), ("b", ns_b))
        ]
        ip_b = runs[1].out["ips"][0]["address"].split("/")[0]
        assert ping(ns_a, ip_b)
        assert len(network.allocations()) == 2
        for cid, netns in (("a", ns_a), ("b", ns_b)):
            network.run(
                "DEL", config, plugin="bridge", container_id=cid, netns=netns, ifname="eth0"
            ).ok()
        assert network.allocations() == {}
    finally:
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)
