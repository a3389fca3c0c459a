"""The real agent (``sluicectl agent --kubeconfig``) serving a prefix-mode network
whose claims live in the API of a real control plane, with pods wired through the
``sluice`` executable as a runtime runs it.

Pods get addresses from blocks the agent claimed as PrefixClaims; without the agent
an ADD fails with code 11 (never a local claim) while a DEL still releases; a
crashed agent comes back holding the same claims; a fragmented pool fails the ADD
with code 102, an Event on the Node and the metrics; ``sluicectl ipam show`` lists
the API's claims.
"""

from __future__ import annotations

import ipaddress
import json
import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.kube import prefixclaims
from ipam.claims import BlockUsage
from ipam.space import free_in_block
from tests.harness.agent import AgentProcess
from tests.harness.claims import (
    apply,
    claim_objects,
    claims_by_node,
    create_node,
    delete_node,
    node_events,
    prefix_ipam,
    unique_pool,
)
from tests.harness.cluster import Cluster
from tests.harness.cni_run import Network, PodNamespaces, sluicectl
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.claims_fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClaimsNode:
    """One node: its Node object, its network (prefix mode, claims in the API), its agent."""

    def __init__(self, cluster: Cluster, network: Network, tmp_path: Path, pool: str) -> None:
        self.cluster = cluster
        self.network = network
        self.pool = pool
        self.name = f"agent-{uuid.uuid4().hex[:8]}"
        self.socket = str(tmp_path / "run" / "agent.sock")
        self.metrics_port = free_port()
        ipam = prefix_ipam(pool, self.name, prefixLength=29, warmPrefixes=0, cooldownSeconds=0)
        self.config = network.config(ipam=ipam, agentSocket=self.socket)
        self.conflist = tmp_path / "net.conflist"
        plugin = {k: v for k, v in self.config.items() if k not in ("name", "cniVersion")}
        self.conflist.write_text(
            json.dumps({"cniVersion": "1.1.0", "name": network.name, "plugins": [plugin]})
        )
        self.agent = AgentProcess(
            self.conflist,
            tmp_path / "agent.log",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--node-name",
            self.name,
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
        )

    def add(self, netns: str, cid: str) -> Any:
        # No K8S_POD_* arguments: the agent then needs no Pod object for the endpoint.
        return self.network.run("ADD", self.config, container_id=cid, netns=netns, ifname="eth0")

    def delete(self, netns: str, cid: str) -> None:
        self.network.delete(netns, cid, config=self.config).ok()

    def show(self, *args: str) -> subprocess.CompletedProcess[str]:
        kubeconfig = ("--kubeconfig", str(self.cluster.kubeconfig))
        shown = sluicectl("ipam", "show", "--conf", self.conflist, *kubeconfig, *args)
        assert shown.returncode == 0, shown.stderr
        return shown

    def claims(self) -> list[str]:
        return claims_by_node(self.cluster, self.pool).get(self.name, [])

    def metrics(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        found = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found


@pytest.fixture
def node(claims_control_plane: Cluster, network: Network, tmp_path: Path) -> Iterator[ClaimsNode]:
    made = ClaimsNode(claims_control_plane, network, tmp_path, unique_pool_27())
    create_node(claims_control_plane, made.name)
    try:
        yield made
    finally:
        made.agent.stop()
        delete_node(claims_control_plane, made.name)  # its claims go with it


def unique_pool_27() -> str:
    return str(next(ipaddress.IPv4Network(unique_pool()).subnets(new_prefix=27)))


def test_pods_through_the_agent_claim_prefixes_in_the_api(
    node: ClaimsNode, pods: PodNamespaces, claims_control_plane: Cluster, tmp_path: Path
) -> None:
    cluster = claims_control_plane
    pool = ipaddress.IPv4Network(node.pool)
    blocks = list(pool.subnets(new_prefix=29))
    # Another node holds every block but the first, 3 addresses used in each.
    other = f"other-{uuid.uuid4().hex[:8]}"
    other_uid = create_node(cluster, other)
    try:
        for block in blocks[1:]:
            apply(cluster, prefixclaims.claim_object(block, pool, other, other_uid, "elsewhere"))
            usage = BlockUsage(3, free_in_block(block, list(block)[:3]))
            status = json.dumps(prefixclaims.usage_status(usage))
            cluster.kubectl(
                "patch", "prefixclaim", prefixclaims.name_of(block), "--subresource=status",
                "--type=merge", "-p", status,
            )  # fmt: skip
        node.agent.start(node.socket)

        first = {cid: pods.new() for cid in ("p1", "p2")}
        for cid, netns in first.items():
            node.add(netns, cid).ok()
        assert node.claims() == [str(blocks[0])]
        (obj,) = [o for o in claim_objects(cluster, node.pool) if o["spec"]["node"] == node.name]
        uid = obj["metadata"]["uid"]

        shown = json.loads(node.show("-o", "json").stdout)
        (net,) = shown["networks"]
        assert net["claimStore"] == "kubernetes"
        assert {(c["cidr"], c["node"]) for c in net["claims"]} == {
            (str(blocks[0]), node.name),
            *((str(b), other) for b in blocks[1:]),
        }
        table = node.show()
        assert "claims of the pool in the Kubernetes API: 4" in table.stdout, table.stdout

        # A crash: the agent comes back holding the same claim, and nothing new.
        node.agent.stop(signal.SIGKILL)
        node.agent.start(node.socket)
        (again,) = [o for o in claim_objects(cluster, node.pool) if o["spec"]["node"] == node.name]
        assert again["metadata"]["uid"] == uid

        # No agent: an ADD fails with code 11 and never claims on its own; DEL works.
        node.agent.stop()
        refused = node.add(pods.new(), "p-offline")
        assert refused.error_code == 11, refused.stdout
        assert '"ipam.claimStore": "kubernetes"' in refused.out["details"]
        node.delete(first["p2"], "p2")
        assert list(node.network.allocations().values()) == [str(blocks[0][0])]
        node.agent.start(node.socket)

        # Fill the block, then one more: the pool is fragmented.
        rest = {f"p{i}": pods.new() for i in range(3, 10)}
        for cid, netns in rest.items():
            node.add(netns, cid).ok()
        failed = node.add(pods.new(), "p-fragmented")
        free = 32 - 8 - 9
        message = (
            f"pool {pool} has {free} free addresses but no free aligned /29 "
            f"(the largest free aligned block is {blocks[1][4]}/30)"
        )
        assert failed.error_code == 102 and failed.out["details"] == message
        assert len(node.network.veths()) == 8  # nothing of the failed ADD is left
        events = eventually(
            lambda: [
                e for e in node_events(cluster, node.name) if e["reason"] == "PrefixPoolFragmented"
            ],
            "an Event on the Node",
        )
        assert events[0]["message"] == message
        metrics = eventually(node.metrics, "metrics")
        labels = f'network="{node.network.name}"'
        assert metrics[f"sluice_ipam_largest_free_aligned_block_addresses{{{labels}}}"] == 4
        fragmented = f'sluice_ipam_no_free_block_total{{{labels},reason="fragmented"}}'
        assert metrics[fragmented] >= 1

        for cid, netns in {"p1": first["p1"], **rest}.items():
            node.delete(netns, cid)
        assert node.network.allocations() == {}
        eventually(lambda: node.claims() == [], "the emptied block is given back")
    finally:
        delete_node(cluster, other)
