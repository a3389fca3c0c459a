"""The Kubernetes network model and the Netpol subset on three nodes in vxlan mode.

What a person checks after reading about the model, through the tunnel: every pod's
address lies in its node's podCIDR and the routes to the other nodes' ranges go
through ``sluice.vx``; pods on different nodes reach each other and the receiver
sees the caller's own pod address; every node reaches every pod, also on the other
nodes, with the nodes' reverse-path filter strict (1, kind's and many
distributions' default) or loose (2): what the API server's proxy, webhooks served
by pods, metrics scrapers and the e2e framework need. A remote node's traffic
arrives from that node's tunnel address (its podCIDR's network address:
docs/configuration.md). Then a policy across nodes, and Kubernetes' own Netpol
specs. The receivers count what reached them (tests/harness/kube_matrix.py).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness.cluster import ClusterError
from tests.harness.e2e import NETPOL_SUBSET, NETPOL_SUBSET_FOCUS, NETPOL_SUBSET_SKIP, run_netpol
from tests.harness.multinode import MultiNodeCluster, Node
from tests.harness.multinode_matrix import (
    NodesMatrix,
    place,
    policy_on_a_from_b_to_c,
    received_tcp_80,
)
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NOT_YET = (AssertionError, OSError, subprocess.SubprocessError, ClusterError)
TUNNEL = "sluice.vx"
CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], 80), 3).close()"


@pytest.fixture
def matrix(vxlan_nodes: MultiNodeCluster) -> Iterator[NodesMatrix]:
    matrix = NodesMatrix(cluster=vxlan_nodes)
    try:
        yield matrix
    finally:
        matrix.destroy()


def tunnel_address(node: Node) -> str:
    return str(ipaddress.ip_network(node.pod_cidr).network_address)


def test_pods_are_in_their_nodes_ranges_routed_through_the_tunnel_and_keep_their_addresses(
    vxlan_nodes: MultiNodeCluster, matrix: NodesMatrix
) -> None:
    a, b, c = place(matrix, a=1, b=2, c=3)
    for key in (a, b, c):
        node = matrix.node_of(key)
        assert ipaddress.ip_address(matrix.pods[key].ip) in ipaddress.ip_network(node.pod_cidr)
    for node in vxlan_nodes.nodes:
        for other in vxlan_nodes.nodes:
            if other.name == node.name:
                continue
            (route,) = json.loads(node.run(["ip", "-j", "route", "show", other.pod_cidr]).stdout)
            assert route["dev"] == TUNNEL, (node.name, other.pod_cidr, route)
    assert matrix.probe([b, c], [a], 80, "tcp") == {(b, a): True, (c, a): True}
    assert matrix.probe([a], [b, c], 80, "tcp") == {(a, b): True, (a, c): True}
    for target, source in ((a, b), (a, c), (b, a), (c, a)):
        assert received_tcp_80(matrix, target, source) >= 1, f"{source} -> {target} unseen"


RP_FILTER_KEYS = ("all", "default", "eth0", TUNNEL)


def rp_filters(nodes: list[Node]) -> dict[tuple[str, str], str]:
    """(node, key) -> its net.ipv4.conf.<key>.rp_filter."""
    found = {}
    for node in nodes:
        for key in RP_FILTER_KEYS:
            proc = node.run(["sysctl", "-n", f"net/ipv4/conf/{key}/rp_filter"])
            assert proc.returncode == 0, proc.stderr
            found[(node.name, key)] = proc.stdout.strip()
    return found


def set_rp_filters(nodes: list[Node], values: dict[tuple[str, str], str]) -> None:
    for node in nodes:
        for key in RP_FILTER_KEYS:
            # Slashes: the tunnel's name has a dot.
            setting = f"net/ipv4/conf/{key}/rp_filter={values[(node.name, key)]}"
            proc = node.run(["sysctl", "-qw", setting])
            assert proc.returncode == 0, proc.stderr


def test_every_node_reaches_every_pod_under_a_strict_or_loose_reverse_path_filter(
    vxlan_nodes: MultiNodeCluster, matrix: NodesMatrix
) -> None:
    keys = place(matrix, a=1, b=2, c=3)
    nodes = vxlan_nodes.nodes
    before = rp_filters(nodes)
    try:
        for rp_filter in (1, 2):
            set_rp_filters(nodes, {where: str(rp_filter) for where in before})
            for key in keys:
                pod = matrix.pods[key]
                home = matrix.node_of(key)
                for node in nodes:
                    proc = node.run([sys.executable, "-c", CONNECT, pod.ip])
                    assert proc.returncode == 0, (
                        f"{node.name} does not reach {key} on {home.name} "
                        f"(rp_filter {rp_filter}): {proc.stderr.strip()[-200:]}"
                    )
                seen = {src for (proto, port, src) in pod.received() if proto == "tcp"}
                remote = {tunnel_address(n) for n in nodes if n.name != home.name}
                assert remote <= seen, f"{key}: from the other nodes' tunnel addresses {remote}"
    finally:
        set_rp_filters(nodes, before)


def test_a_policy_across_nodes_holds_both_ways_through_the_tunnel(matrix: NodesMatrix) -> None:
    a, b, c = place(matrix, a=1, b=2, c=3)
    matrix.apply(policy_on_a_from_b_to_c(matrix))
    expected_in, expected_out = {(b, a): True, (c, a): False}, {(a, b): False, (a, c): True}
    eventually(
        lambda: matrix.probe([b, c], [a], 80, "tcp") == expected_in,
        f"ingress to {a} (node 1): from {b} (node 2) only",
        timeout=60,
        retry_on=NOT_YET,
    )
    eventually(
        lambda: matrix.probe([a], [b, c], 80, "tcp") == expected_out,
        f"egress from {a} (node 1): to {c} (node 3) only",
        timeout=60,
        retry_on=NOT_YET,
    )
    before = {(t, s): received_tcp_80(matrix, t, s) for t, s in ((a, c), (b, a))}
    assert matrix.probe([b, c], [a], 80, "tcp") == expected_in
    assert matrix.probe([a], [b, c], 80, "tcp") == expected_out
    assert received_tcp_80(matrix, a, c) == before[(a, c)], "a denied flow arrived"
    assert received_tcp_80(matrix, b, a) == before[(b, a)], "a denied flow arrived"


def test_networkpolicy_e2e_subset_through_the_tunnel(vxlan_nodes: MultiNodeCluster) -> None:
    tally = run_netpol(vxlan_nodes, focus=NETPOL_SUBSET_FOCUS, skip=NETPOL_SUBSET_SKIP)
    assert not tally.failed and len(tally.passed) == len(NETPOL_SUBSET), tally.summary()
