"""The sluice plugin against the real kernel: wiring, results, DEL, CHECK, STATUS, GC.

Every test creates its pods as network namespaces and runs the installed
plugin exactly as a runtime would (environment, stdin, stdout, exit code).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cni.datapath.maps import Datapath
from cni.net.link import NODE_VETH_MAC
from cni.spec.versions import SUPPORTED
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, in_netns, node_veth, ping
from tests.harness.probes import node_address, udp_source_seen

GATEWAY = "169.254.1.1"


def pod_ip(result: dict[str, Any]) -> str:
    if "ips" in result:
        return result["ips"][0]["address"].split("/")[0]
    return result["ip4"]["ip"].split("/")[0]


def link_json(netns: str | None, name: str) -> dict[str, Any]:
    prefix = ["-n", Path(netns).name] if netns else []
    out = subprocess.run(
        ["ip", "-j", *prefix, "-d", "link", "show", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)[0]


# -- ADD: result formats and kernel state ---------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED)
def test_add_result_in_each_spec_version(
    network: Network, pods: PodNamespaces, version: str
) -> None:
    netns = pods.new()
    result = network.add(netns, "c1", config=network.config(version))
    assert result["cniVersion"] == version
    address = pod_ip(result)
    assert ipaddress.ip_address(address) in ipaddress.ip_network(network.subnet)

    if version in ("0.1.0", "0.2.0"):
        assert set(result) <= {"cniVersion", "ip4", "dns"}
        assert result["ip4"]["ip"] == f"{address}/24"
        assert result["ip4"]["gateway"] == GATEWAY
        assert result["ip4"]["routes"] == [{"dst": "0.0.0.0/0", "gw": GATEWAY}]
    else:
        host, pod = result["interfaces"]
        assert host["name"].startswith("sl") and host["mac"] == NODE_VETH_MAC
        assert "sandbox" not in host
        assert pod["name"] == "eth0" and pod["sandbox"] == netns
        assert pod["mac"] == link_json(netns, "eth0")["address"]
        ip = result["ips"][0]
        assert ip["address"] == f"{address}/24" and ip["gateway"] == GATEWAY
        assert ip["interface"] == 1
        assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": GATEWAY}]
        # 0.3.x and 0.4.0 require the address family; 1.x dropped it.
        assert ("version" in ip) == (version in ("0.3.0", "0.3.1", "0.4.0"))
        # Interface MTU is new in 1.1.0.
        assert ("mtu" in pod) == (version == "1.1.0")

    network.delete(netns, "c1", config=network.config(version)).ok()
    assert network.veths() == [] and network.allocations() == {}


def test_add_wires_the_pod(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    result = network.add(netns, "c1", config=network.config(mtu=1400))
    address = pod_ip(result)
    pod = link_json(netns, "eth0")
    node_veth = result["interfaces"][0]["name"]
    host = link_json(None, node_veth)
    assert pod["mtu"] == host["mtu"] == 1400
    assert result["interfaces"][1]["mtu"] == 1400
    assert pod["linkinfo"]["info_kind"] == "veth" and "UP" in pod["flags"]
    assert host["ifalias"] == f"sluice/{network.name}/c1/eth0"
    routes = in_netns(netns, "ip", "-4", "route").stdout
    assert f"default via {GATEWAY} dev eth0" in routes
    assert f"{network.subnet} " not in routes  # no on-link subnet route
    neigh = in_netns(netns, "ip", "neigh", "show", GATEWAY).stdout
    assert NODE_VETH_MAC in neigh and "PERMANENT" in neigh
    host_routes = subprocess.run(
        ["ip", "route", "show", f"{address}/32"], capture_output=True, text=True, check=True
    ).stdout
    assert f"dev {node_veth}" in host_routes
    assert network.allocations() == {("c1", "eth0"): address}
    assert network.masqueraded() == {address}
    network.delete(netns, "c1").ok()


def test_mtu_defaults_to_the_default_route_interface(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    out = subprocess.run(
        ["ip", "-j", "route", "show", "default"], capture_output=True, text=True, check=True
    ).stdout
    uplink = json.loads(out)[0]["dev"]
    result = network.add(netns, "c1")
    assert result["interfaces"][1]["mtu"] == link_json(None, uplink)["mtu"]
    network.delete(netns, "c1").ok()


def test_node_and_pods_reach_each_other_without_nat(network: Network, pods: PodNamespaces) -> None:
    ns_a, ns_b = pods.new(), pods.new()
    ip_a = pod_ip(network.add(ns_a, "a"))
    ip_b = pod_ip(network.add(ns_b, "b"))
    assert ping(None, ip_a), "node cannot reach its pod"
    assert ping(ns_a, ip_b), "pod cannot reach a pod on the same node"
    assert ping(ns_b, node_address()), "pod cannot reach the node"
    assert udp_source_seen(ns_a, ns_b, ip_b) == ip_a, "pod-to-pod traffic was NATed"
    assert udp_source_seen(None, ns_a, ip_a) != ip_b
    network.delete(ns_a, "a").ok()
    network.delete(ns_b, "b").ok()


@pytest.fixture
def external_host(pods: PodNamespaces) -> Any:
    """A namespace outside the cluster range, reached through the node (198.51.100.0/24)."""
    netns = pods.new()
    name = Path(netns).name
    node_end = f"slx{os.urandom(3).hex()}"
    subprocess.run(
        ["ip", "link", "add", node_end, "type", "veth", "peer", "name", "ext0", "netns", name],
        check=True,
    )
    try:
        subprocess.run(["ip", "addr", "add", "198.51.100.1/24", "dev", node_end], check=True)
        subprocess.run(["ip", "link", "set", node_end, "up"], check=True)
        in_netns(netns, "ip", "addr", "add", "198.51.100.2/24", "dev", "ext0", check=True)
        in_netns(netns, "ip", "link", "set", "ext0", "up", check=True)
        # A route back to pods, so that un-masqueraded replies could return too.
        in_netns(netns, "ip", "route", "add", "10.0.0.0/8", "via", "198.51.100.1", check=True)
        yield netns
    finally:
        subprocess.run(["ip", "link", "del", node_end], check=False, capture_output=True)


def test_ip_masq_only_for_traffic_leaving_the_cluster(
    network: Network, pods: PodNamespaces, external_host: str
) -> None:
    ns_a, ns_b = pods.new(), pods.new()
    ip_a = pod_ip(network.add(ns_a, "a"))
    ip_b = pod_ip(network.add(ns_b, "b"))
    assert udp_source_seen(ns_a, external_host, "198.51.100.2") == "198.51.100.1"
    assert udp_source_seen(ns_a, ns_b, ip_b) == ip_a
    network.delete(ns_a, "a").ok()
    assert network.masqueraded() == {ip_b}
    network.delete(ns_b, "b").ok()
    assert network.masqueraded() == set()


def test_ip_masq_off_keeps_pod_source(
    network: Network, pods: PodNamespaces, external_host: str
) -> None:
    netns = pods.new()
    config = network.config(ipMasq=False)
    address = pod_ip(network.add(netns, "a", config=config))
    assert udp_source_seen(netns, external_host, "198.51.100.2") == address
    assert network.masqueraded() == set()
    network.delete(netns, "a", config=config).ok()


def test_dns_from_config_is_reported(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    dns = {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"], "options": ["ndots:5"]}
    result = network.add(netns, "c1", config=network.config(dns=dns))
    assert result["dns"] == dns
    network.delete(netns, "c1").ok()


def test_mac_from_runtime_config_matches_case_insensitively(
    network: Network, pods: PodNamespaces
) -> None:
    netns = pods.new()
    config = network.config(capabilities={"mac": True}, runtimeConfig={"Mac": "02:11:22:33:44:55"})
    result = network.add(netns, "c1", config=config)
    assert result["interfaces"][1]["mac"] == "02:11:22:33:44:55"
    assert link_json(netns, "eth0")["address"] == "02:11:22:33:44:55"
    network.delete(netns, "c1").ok()
    # A capability the plugin did not declare is not used.
    other = pods.new()
    config = network.config(
        capabilities={"portMappings": True}, runtimeConfig={"mac": "02:11:22:33:44:66"}
    )
    result = network.add(other, "c2", config=config)
    assert result["interfaces"][1]["mac"] != "02:11:22:33:44:66"
    network.delete(other, "c2").ok()


def test_kubernetes_cni_args_are_accepted_and_recorded(
    network: Network, pods: PodNamespaces
) -> None:
    netns = pods.new()
    args = "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u1"
    network.add(netns, "c1", cni_args=args)
    with sqlite3.connect(network.state_dir / "ipam" / f"{network.name}.db") as db:
        row = db.execute("SELECT pod_namespace, pod_name FROM allocations").fetchone()
    assert row == ("shop", "cart-0")
    network.delete(netns, "c1", cni_args=args).ok()


def test_prev_result_is_kept_and_extended(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "sandbox": netns}],
        "ips": [{"address": "192.168.50.2/24", "interface": 0}],
        "routes": [{"dst": "192.168.0.0/16"}],
        "dns": {"nameservers": ["192.168.50.1"]},
    }
    config = network.config("1.0.0", prevResult=prev)
    result = network.add(netns, "c1", config=config)
    assert result["interfaces"][0]["name"] == "net1"
    assert len(result["interfaces"]) == 3
    assert result["ips"][0] == {"address": "192.168.50.2/24", "interface": 0}
    assert result["ips"][1]["interface"] == 2
    assert {"dst": "192.168.0.0/16"} in result["routes"]
    assert result["dns"] == {"nameservers": ["192.168.50.1"]}
    network.delete(netns, "c1", config=network.config("1.0.0", prevResult=result)).ok()


# -- ADD failures leave nothing behind --------------------------------------------------


def assert_nothing_left(network: Network) -> None:
    assert network.veths() == []
    assert network.allocations() == {}
    assert network.masqueraded() == set()


def test_add_fails_when_the_interface_exists(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    in_netns(
        netns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0", check=True
    )
    run = network.run("ADD", container_id="c1", netns=netns, ifname="eth0")
    assert run.rc != 0 and run.error_code == 4 and "already exists" in run.out["details"]
    assert_nothing_left(network)


def test_add_refuses_the_plugins_own_netns(network: Network) -> None:
    # The test runner shares the plugin's namespace, as a recycled /proc/PID path would.
    own = f"/proc/{os.getpid()}/ns/net"
    run = network.run("ADD", container_id="c1", netns=own, ifname="eth0")
    assert run.error_code == 4 and "own network namespace" in run.out["details"]
    assert_nothing_left(network)


@pytest.mark.parametrize("netns", ["/run/netns/slt-does-not-exist", "/etc/hostname"])
def test_add_with_a_bad_netns_path(network: Network, netns: str) -> None:
    run = network.run("ADD", container_id="c1", netns=netns, ifname="eth0")
    assert run.error_code == 4 and netns in run.out["details"]
    assert_nothing_left(network)


def test_add_rolls_back_when_the_kernel_refuses_a_step(
    network: Network, pods: PodNamespaces
) -> None:
    # The second identical route fails with EEXIST after the veth, the
    # address and the first route exist: all of it must be undone.
    netns = pods.new()
    ipam = {
        "type": "sluice-ipam",
        "subnet": network.subnet,
        "routes": [{"dst": "10.99.0.0/16"}, {"dst": "10.99.0.0/16"}],
    }
    run = network.run(
        "ADD", network.config(ipam=ipam), container_id="c1", netns=netns, ifname="eth0"
    )
    assert run.error_code == 100 and "10.99.0.0/16" in run.out["details"]
    assert_nothing_left(network)
    assert "eth0" not in in_netns(netns, "ip", "link").stdout


def test_add_rolls_back_a_delegated_ipam(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    # host-local hands out an IPv6 address, which sluice does not wire yet:
    # the delegated reservation must be released again.
    netns = pods.new()
    data_dir = tmp_path / "host-local"
    ipam = {"type": "host-local", "subnet": "fd00:10::/64", "dataDir": str(data_dir)}
    # Debian's host-local speaks spec versions up to 1.0.0.
    run = network.run(
        "ADD",
        network.config("1.0.0", ipam=ipam, clusterCIDR="10.0.0.0/8"),
        container_id="c1",
        netns=netns,
        ifname="eth0",
    )
    assert run.error_code == 2 and "IPv4" in run.out["details"]
    assert [
        p.name
        for p in (data_dir / network.name).iterdir()
        if not p.name.startswith(("lock", "last_"))
    ] == []
    assert network.veths() == []


def start_add(
    network: Network,
    netns: str,
    container_id: str,
    command: str = "ADD",
    config: dict[str, Any] | None = None,
    cni_path: str = "",
) -> subprocess.Popen[bytes]:
    """Start a verb in the background, as a runtime does."""
    stdin = network.state_dir.parent / f"{command}-{container_id}.json"
    stdin.write_text(json.dumps(config or network.config()))
    with stdin.open("rb") as config:
        return subprocess.Popen(
            [network.bin_dir / "sluice"],
            stdin=config,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={
                "PATH": "/usr/sbin:/usr/bin",
                "CNI_COMMAND": command,
                "CNI_CONTAINERID": container_id,
                "CNI_NETNS": netns,
                "CNI_IFNAME": "eth0",
                "CNI_PATH": ":".join(p for p in (str(network.bin_dir), cni_path) if p),
            },
        )


def test_sigterm_during_add_rolls_back(
    network: Network, pods: PodNamespaces, tmp_path: Path
) -> None:
    """SIGTERM while the delegated IPAM is allocating: ADD finishes that step, then
    undoes it (the delegate's DEL releases the address) and fails with code 11."""
    marker = tmp_path / "ipam-started"
    slow = tmp_path / "slow-ipam"
    slow.write_text(
        "#!/bin/sh\n"
        f'[ "$CNI_COMMAND" = ADD ] && touch {marker} && sleep 1\n'
        f"exec {network.bin_dir / 'sluice-ipam'}\n"
    )
    slow.chmod(0o755)
    config = network.config(ipam={"type": "slow-ipam", "subnet": network.subnet})
    netns = pods.new()
    proc = start_add(network, netns, "t0", config=config, cni_path=f"{tmp_path}")
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0, (out, err)
    error = json.loads(out)
    assert error["code"] == 11 and "rolled back" in error["details"], error
    assert_nothing_left(network)

    # And at random moments of an ordinary ADD: done, or undone, never half done.
    for attempt in range(1, 6):
        netns = pods.new()
        proc = start_add(network, netns, f"t{attempt}")
        time.sleep(random.uniform(0.15, 0.5))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        if proc.returncode == 0:
            network.delete(netns, f"t{attempt}").ok()
        else:
            assert network.veths() == [], (proc.returncode, out, err)
            assert_nothing_left(network)
        pods.remove(netns)
    assert_nothing_left(network)


def test_sigkill_at_any_point_of_add_then_del_cleans_up(
    network: Network, pods: PodNamespaces
) -> None:
    """A runtime's timeout kills the plugin; the DEL that follows must clean everything."""
    for attempt in range(8):
        netns = pods.new()
        proc = start_add(network, netns, f"k{attempt}")
        time.sleep(random.uniform(0.1, 0.6))
        proc.kill()
        proc.communicate()
        network.delete(netns, f"k{attempt}").ok()
        assert_nothing_left(network)
        # The namespace is reusable: a new ADD for the same container works.
        network.add(netns, f"k{attempt}")
        network.delete("", f"k{attempt}").ok()
        pods.remove(netns)
    assert_nothing_left(network)


def test_sigkill_at_any_point_of_del_then_del_or_gc_cleans_up(
    network: Network, pods: PodNamespaces
) -> None:
    for attempt in range(8):
        netns = pods.new()
        network.add(netns, f"d{attempt}")
        proc = start_add(network, netns, f"d{attempt}", command="DEL")
        time.sleep(random.uniform(0.1, 0.5))
        proc.kill()
        proc.communicate()
        if attempt % 2:
            network.delete(netns, f"d{attempt}").ok()
        else:
            network.run("GC").ok()  # no valid attachment left
        assert_nothing_left(network)
        pods.remove(netns)


def test_concurrent_adds_never_share_an_address(network: Network, pods: PodNamespaces) -> None:
    namespaces = [pods.new() for _ in range(16)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: network.add(namespaces[i], f"p{i}"), range(16)))
    addresses = [pod_ip(r) for r in results]
    assert len(set(addresses)) == 16
    assert len(network.veths()) == 16
    with ThreadPoolExecutor(max_workers=16) as pool:
        runs = list(pool.map(lambda i: network.delete(namespaces[i], f"p{i}"), range(16)))
    assert all(run.rc == 0 for run in runs)
    assert_nothing_left(network)


# -- DEL ---------------------------------------------------------------------------------


def test_del_twice_and_without_add(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    network.delete(netns, "never-added").ok()
    network.add(netns, "c1")
    network.delete(netns, "c1").ok()
    network.delete(netns, "c1").ok()
    assert_nothing_left(network)


@pytest.mark.parametrize("netns_value", ["", "same-path"])
def test_del_after_the_netns_is_gone(
    network: Network, pods: PodNamespaces, netns_value: str
) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    pods.remove(netns)  # the runtime removed the sandbox first
    config = network.config(prevResult=result)
    network.delete(netns if netns_value else "", "c1", config=config).ok()
    assert_nothing_left(network)


def test_del_is_best_effort_with_a_broken_prev_result(
    network: Network, pods: PodNamespaces
) -> None:
    netns = pods.new()
    network.add(netns, "c1")
    config = network.config(prevResult={"ips": "garbage"})
    network.delete(netns, "c1", config=config).ok()
    assert_nothing_left(network)


# -- CHECK ---------------------------------------------------------------------------


def _drop_address(netns: str, result: dict[str, Any]) -> None:
    in_netns(netns, "ip", "addr", "del", result["ips"][0]["address"], "dev", "eth0", check=True)


def _drop_default_route(netns: str, result: dict[str, Any]) -> None:
    in_netns(netns, "ip", "route", "del", "default", check=True)


def _drop_neighbor(netns: str, result: dict[str, Any]) -> None:
    in_netns(netns, "ip", "neigh", "del", GATEWAY, "dev", "eth0", check=True)


def _drop_host_route(netns: str, result: dict[str, Any]) -> None:
    subprocess.run(["ip", "route", "del", f"{pod_ip(result)}/32"], check=True)


def _drop_masquerade(netns: str, result: dict[str, Any], network: Network) -> None:
    subprocess.run(
        [
            "nft",
            "delete",
            "element",
            "ip",
            f"sluice_{network.name}",
            "pods",
            f"{{ {pod_ip(result)} }}",
        ],
        check=True,
    )


def _drop_allocation(netns: str, result: dict[str, Any], network: Network) -> None:
    with sqlite3.connect(network.state_dir / "ipam" / f"{network.name}.db") as db:
        db.execute("DELETE FROM allocations")


def _pod_link_down(netns: str, result: dict[str, Any]) -> None:
    in_netns(netns, "ip", "link", "set", "eth0", "down", check=True)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_drop_address, "address"),
        (_drop_default_route, "route 0.0.0.0/0"),
        (_drop_neighbor, "neighbour"),
        (_drop_host_route, "no route"),
        (_drop_masquerade, "masquerade"),
        (_drop_allocation, "sluice-ipam"),
        (_pod_link_down, "down"),
    ],
)
def test_check_finds_what_is_missing(
    network: Network, pods: PodNamespaces, damage: Any, words: str
) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    run = network.check(netns, "c1", result)
    assert run.rc == 0 and run.stdout == ""
    if damage in (_drop_masquerade, _drop_allocation):
        damage(netns, result, network)
    else:
        damage(netns, result)
    run = network.check(netns, "c1", result)
    assert run.error_code == 101, run.stdout
    assert words in run.out["details"]
    network.delete(netns, "c1").ok()


def test_check_tolerates_routes_added_later(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    in_netns(netns, "ip", "route", "add", "10.77.0.0/16", "via", GATEWAY, check=True)
    network.check(netns, "c1", result).ok()
    network.delete(netns, "c1").ok()


def test_check_needs_prev_result(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    network.add(netns, "c1")
    run = network.run("CHECK", container_id="c1", netns=netns, ifname="eth0")
    assert run.error_code == 7 and "prevResult" in run.out["details"]
    network.delete(netns, "c1").ok()


def test_check_when_the_veth_is_gone(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    veth, ifindex = node_veth(result)
    subprocess.run(["ip", "link", "del", veth], check=True)
    run = network.check(netns, "c1", result)
    assert run.error_code == 101 and "missing" in run.out["details"]
    network.delete(netns, "c1").ok()
    assert_nothing_left(network)
    with Datapath(TEST_BPF_DIR) as datapath:
        assert datapath.endpoints.get(ifindex) is None, "DEL dropped the vanished veth's endpoint"


# -- STATUS ----------------------------------------------------------------------------


def test_status_ready(network: Network) -> None:
    run = network.run("STATUS")
    assert run.rc == 0 and run.stdout == ""


def test_status_when_no_address_is_left(network: Network, pods: PodNamespaces) -> None:
    # A /30 with its gateway leaves exactly one address.
    ipam = {"type": "sluice-ipam", "subnet": "10.254.7.0/30"}
    config = network.config(ipam=ipam)
    netns = pods.new()
    network.run("STATUS", config).ok()
    result = network.add(netns, "c1", config=config)
    assert pod_ip(result) == "10.254.7.2"
    run = network.run("STATUS", config)
    assert run.error_code == 50 and "no address left" in run.out["details"]
    other = pods.new()
    run = network.run("ADD", config, container_id="c2", netns=other, ifname="eth0")
    assert run.error_code == 102 and "10.254.7.0/30" in run.out["details"]
    # A released address cools down but still counts: it is reused when nothing else is left.
    network.delete(netns, "c1", config=config).ok()
    network.run("STATUS", config).ok()
    assert pod_ip(network.add(other, "c2", config=config)) == "10.254.7.2"
    network.delete(other, "c2", config=config).ok()


def test_status_when_the_store_is_unusable(network: Network, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    run = network.run("STATUS", network.config(stateDir=str(blocker / "state")))
    assert run.error_code == 50 and "IPAM store" in run.out["details"]


# -- GC ----------------------------------------------------------------------------------


def test_gc_releases_everything_not_listed(network: Network, pods: PodNamespaces) -> None:
    ns = {name: pods.new() for name in "abc"}
    ips = {name: pod_ip(network.add(path, name)) for name, path in ns.items()}
    config = network.config(
        **{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]}
    )
    network.run("GC", config).ok()
    assert network.allocations() == {("a", "eth0"): ips["a"]}
    assert len(network.veths()) == 1
    assert network.masqueraded() == {ips["a"]}
    assert ping(None, ips["a"])
    network.delete(ns["a"], "a").ok()
    assert_nothing_left(network)


@pytest.mark.parametrize("valid", ["absent", None, [], "legacy-key"])
def test_gc_without_valid_attachments_releases_all(
    network: Network, pods: PodNamespaces, valid: Any
) -> None:
    netns = pods.new()
    network.add(netns, "a")
    extra: dict[str, Any] = {}
    if valid == "legacy-key":
        extra["cni.dev/attachments"] = []
    elif valid != "absent":
        extra["cni.dev/valid-attachments"] = valid
    network.run("GC", network.config(**extra)).ok()
    assert_nothing_left(network)
    assert "eth0" not in in_netns(netns, "ip", "link").stdout


def test_gc_rejects_malformed_attachments(network: Network) -> None:
    run = network.run("GC", network.config(**{"cni.dev/valid-attachments": [{"id": 1}]}))
    assert run.error_code == 6


# -- delegated IPAM ----------------------------------------------------------------------


def test_delegates_to_host_local(network: Network, pods: PodNamespaces, tmp_path: Path) -> None:
    netns = pods.new()
    data_dir = tmp_path / "host-local"
    ipam = {"type": "host-local", "subnet": network.subnet, "dataDir": str(data_dir)}
    config = network.config("1.0.0", ipam=ipam)  # Debian's host-local speaks up to 1.0.0
    result = network.add(netns, "c1", config=config)
    address = pod_ip(result)
    assert (data_dir / network.name / address).read_text().startswith("c1")
    assert ping(None, address)
    check_config = network.config("1.0.0", ipam=ipam, prevResult=result)
    network.run("CHECK", check_config, container_id="c1", netns=netns, ifname="eth0").ok()
    network.delete(netns, "c1", config=config).ok()
    assert not (data_dir / network.name / address).exists()
    assert network.veths() == []


def test_delegation_needs_cni_path(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    config = network.config("1.0.0", ipam={"type": "host-local", "subnet": network.subnet})
    run = network.run("ADD", config, container_id="c1", netns=netns, ifname="eth0", cni_path="")
    assert run.error_code == 4 and "CNI_PATH" in run.out["details"]
    run = network.run(
        "ADD", config, container_id="c1", netns=netns, ifname="eth0", cni_path="/nonexistent"
    )
    assert run.error_code == 104 and "host-local" in run.out["details"]
    assert network.veths() == []


def test_delegates_every_verb_to_an_exec_ipam(network: Network, pods: PodNamespaces) -> None:
    """A spec 1.1.0 IPAM found through CNI_PATH (sluice-ipam under another name) gets ADD,
    CHECK, STATUS, GC and DEL with the caller's stdin."""
    (network.bin_dir.parent / "exec-ipam").mkdir(exist_ok=True)
    alias = network.bin_dir.parent / "exec-ipam" / "other-ipam"
    if not alias.exists():
        alias.symlink_to(network.bin_dir / "sluice-ipam")
    cni_path = f"{network.bin_dir}:{alias.parent}"
    ipam = {"type": "other-ipam", "subnet": network.subnet}
    config = network.config(ipam=ipam)
    netns = pods.new()
    result = network.add(netns, "c1", config=config, cni_path=cni_path)
    assert network.allocations() == {("c1", "eth0"): pod_ip(result)}
    network.run(
        "CHECK",
        network.config(ipam=ipam, prevResult=result),
        container_id="c1",
        netns=netns,
        ifname="eth0",
        cni_path=cni_path,
    ).ok()
    network.run("STATUS", config, cni_path=cni_path).ok()
    network.run(
        "GC",
        network.config(
            ipam=ipam, **{"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]}
        ),
        cni_path=cni_path,
    ).ok()
    assert len(network.allocations()) == 1
    network.delete(netns, "c1", config=config, cni_path=cni_path).ok()
    assert_nothing_left(network)
    # The delegate's own CNI error comes back unchanged (here: nothing left to hand out).
    tiny = {"type": "other-ipam", "subnet": "10.254.9.0/30"}
    network.add(netns, "c2", config=network.config(ipam=tiny), cni_path=cni_path)
    run = network.run("STATUS", network.config(ipam=tiny), cni_path=cni_path)
    assert run.error_code == 50
    network.delete(netns, "c2", config=network.config(ipam=tiny), cni_path=cni_path).ok()


def test_a_late_del_with_a_stale_prev_result_spares_the_new_owner(
    network: Network, pods: PodNamespaces
) -> None:
    config = network.config(
        ipam={"type": "sluice-ipam", "subnet": network.subnet, "cooldownSeconds": 0}
    )
    old_ns, new_ns = pods.new(), pods.new()
    old = network.add(old_ns, "old", config=config)
    network.delete(old_ns, "old", config=config).ok()
    new = network.add(new_ns, "new", config=config)
    assert pod_ip(new) == pod_ip(old)  # no cooldown: the address is reused at once
    # The runtime repeats the old pod's DEL with its old result.
    network.delete(old_ns, "old", config=network.config(ipam=config["ipam"], prevResult=old)).ok()
    assert network.masqueraded() == {pod_ip(new)}
    network.check(new_ns, "new", new).ok()
    network.delete(new_ns, "new", config=config).ok()
