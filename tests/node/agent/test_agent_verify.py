"""Incremental equals rebuild: ``sluicectl datapath verify`` compares a running agent's
maps with a computation from scratch, and the agent's periodic verification repairs
and counts what drifted (``sluice_policy_drift_total``).

The drift is made for real, as a writer that died midway or a hostile one would
leave the pinned state: an endpoint's policy id cleared, a rule slipped into a shared
rule set's inner map, a pod's address taken out of ``ep_by_ip``; real packets show
each one opened or broke something, and that the repair closed it again.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import bpf
from cni.datapath.maps import Datapath, iterate
from cni.datapath.structs import NONE, RULE_ANY_PORT, Rule, RuleKey, ip_be, port_be
from tests.harness.agent import AgentNetwork, PolicyCluster, policy
from tests.harness.cni_run import TEST_BPF_DIR, TEST_NETNS_PREFIX, PodNamespaces, sluicectl
from tests.harness.waiting import eventually

pytestmark = [pytest.mark.root]

VERIFY_INTERVAL = "1"


@pytest.fixture(scope="module")
def cluster(bin_dir: Path) -> Iterator[PolicyCluster]:
    with tempfile.TemporaryDirectory(prefix="sluice-verify-") as work:
        net = AgentNetwork.create(Path(work), bin_dir)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            net.metrics_port = probe.getsockname()[1]  # type: ignore[attr-defined]
        net.agent.extra = (
            "--verify-interval", VERIFY_INTERVAL,
            "--metrics-address", f"127.0.0.1:{net.metrics_port}",  # type: ignore[attr-defined]
        )  # fmt: skip
        made = PolicyCluster(net, PodNamespaces(TEST_NETNS_PREFIX))
        try:
            net.start()
            made.create()
            # x/a may reach y/a on TCP 80 only; nothing else reaches x/a.
            net.apply(
                policy(
                    "x", "only-80",
                    podSelector={"matchLabels": {"pod": "a"}},
                    policyTypes=["Ingress", "Egress"],
                    egress=[
                        {
                            "to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                    "podSelector": {"matchLabels": {"pod": "a"}}}],
                            "ports": [{"port": 80, "protocol": "TCP"}],
                        }
                    ],
                )
            )  # fmt: skip
            yield made
        finally:
            try:
                made.destroy()
            finally:
                net.cleanup()
                made.pods_ns.cleanup()


def verify(cluster: PolicyCluster, *extra: str) -> tuple[int, dict[str, object]]:
    proc = sluicectl("datapath", "verify", "--conf", cluster.net.conflist, "-o", "json", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def drift_count(cluster: PolicyCluster, kind: str) -> float:
    port = cluster.net.metrics_port  # type: ignore[attr-defined]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'sluice_policy_drift_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    return 0.0


def reaches(cluster: PolicyCluster, source: str, target: str, port: int) -> bool:
    return cluster.pods[source].reaches([(cluster.pods[target].ip, port, "tcp")], 1.0) == [True]


def ifindex_of(cluster: PolicyCluster, key: str) -> int:
    ns, name = key.split("/")
    (found,) = [e for e in cluster.net.endpoints() if e["pod"] == f"{ns}/{name}"]
    return int(found["ifindex"])


def datapath_of(cluster: PolicyCluster) -> Datapath:
    return Datapath(TEST_BPF_DIR)


def test_a_healthy_agent_verifies_clean(cluster: PolicyCluster) -> None:
    rc, report = verify(cluster)
    assert rc == 0, report
    assert report["differences"] == [] and report["checked"] == 9, report
    text = sluicectl("datapath", "verify", "--conf", cluster.net.conflist)
    assert text.returncode == 0 and "9 endpoint(s) checked" in text.stdout, text.stdout


def test_a_cleared_policy_id_is_found_and_repaired(cluster: PolicyCluster) -> None:
    """A crash between two writes left x/a's egress unisolated: x/a reaches y/b on 81."""
    assert not reaches(cluster, "x/a", "y/b", 81)
    before = drift_count(cluster, "datapath")
    ifindex = ifindex_of(cluster, "x/a")
    with datapath_of(cluster) as datapath, datapath.lock:
        entry = datapath.endpoints.get(ifindex)
        assert entry is not None and entry.egress_policy != NONE
        entry.egress_policy = NONE
        datapath.endpoints.put(ifindex, entry)
    rc, report = verify(cluster)
    assert rc == 1, report
    assert any(
        d["kind"] == "datapath" and d["subject"] == "x/a" and "egress: not isolated" in d["detail"]
        for d in report["differences"]  # type: ignore[union-attr]
    ), report
    # The periodic verification sees it twice, counts it and installs x/a's policy again.
    eventually(lambda: verify(cluster)[0] == 0, "the agent repairing x/a's entry", 20)
    assert drift_count(cluster, "datapath") >= before + 1
    assert not reaches(cluster, "x/a", "y/b", 81)
    assert reaches(cluster, "x/a", "y/a", 80)


def test_a_rule_slipped_into_a_shared_rule_set_is_found_and_the_set_rebuilt(
    cluster: PolicyCluster,
) -> None:
    """A writer turned "TCP 80" into "TCP, any port" in the inner rule map that x/a's
    egress id names: x/a reaches y/a on 81. The rule set's maps no longer hold what its digest
    says, so a reinstall must not reuse them."""
    assert not reaches(cluster, "x/a", "y/a", 81)
    ifindex = ifindex_of(cluster, "x/a")
    with datapath_of(cluster) as datapath, datapath.lock:
        entry = datapath.endpoints.get(ifindex)
        assert entry is not None
        policy_id = entry.egress_policy
        rule_map = datapath.inner_maps("rules")[policy_id]
        fd = bpf.map_get_fd_by_id(rule_map)
        try:
            exact = [k for k in iterate(fd, RuleKey) if k.proto == 6 and k.port == port_be(80)]
            assert exact, "no TCP 80 rule in x/a's egress rule set"
            for key in exact:
                assert bpf.map_delete(fd, key)
                bpf.map_update(fd, RuleKey(key.set, 0, 6, 0), Rule(flags=RULE_ANY_PORT))
        finally:
            os.close(fd)
    assert reaches(cluster, "x/a", "y/a", 81), "the slipped rule did not open TCP 81"
    rc, report = verify(cluster)
    assert rc == 1 and any(
        d["kind"] == "datapath" and f"policy id {policy_id} holds" in d["detail"]
        for d in report["differences"]  # type: ignore[union-attr]
    ), report
    eventually(lambda: verify(cluster)[0] == 0, "the agent rebuilding the rule set", 20)
    assert not reaches(cluster, "x/a", "y/a", 81)
    assert reaches(cluster, "x/a", "y/a", 80)
    with datapath_of(cluster) as datapath:
        entry = datapath.endpoints.get(ifindex)
        assert entry is not None and entry.egress_policy != policy_id, "the lying set was reused"


def test_a_lost_address_is_found_and_registered_again(cluster: PolicyCluster) -> None:
    """y/b's address gone from ep_by_ip: its own packets are dropped as spoofed."""
    ip = cluster.pods["y/b"].ip
    assert reaches(cluster, "y/b", "z/a", 80)
    before = drift_count(cluster, "addresses")
    with datapath_of(cluster) as datapath, datapath.lock:
        assert bpf.map_delete(datapath.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
    rc, report = verify(cluster)
    assert rc == 1 and any(d["kind"] == "addresses" for d in report["differences"]), report  # type: ignore[union-attr]
    eventually(lambda: verify(cluster)[0] == 0, "the agent registering y/b's address", 20)
    assert drift_count(cluster, "addresses") >= before + 1
    assert reaches(cluster, "y/b", "z/a", 80)


def test_verify_repair_on_demand(cluster: PolicyCluster) -> None:
    """``--repair`` makes good at once what it found (here: x/a's ingress cleared)."""
    ifindex = ifindex_of(cluster, "x/a")
    with datapath_of(cluster) as datapath, datapath.lock:
        entry = datapath.endpoints.get(ifindex)
        assert entry is not None
        entry.ingress_policy = NONE
        datapath.endpoints.put(ifindex, entry)
    rc, report = verify(cluster, "--repair")
    assert rc == 1 and report["differences"], report
    deadline = time.monotonic() + 10
    while verify(cluster)[0] != 0:
        assert time.monotonic() < deadline, verify(cluster)[1]
        time.sleep(0.2)
    assert not reaches(cluster, "y/a", "x/a", 80)
