"""The pool of empty conntrack tables and the reaper: ADD and DEL write no map of maps
when the pool is stocked (each such write costs an RCU grace period), and the reaper
deletes every piece of garbage (after DEL, GC, a veth that vanished) and nothing an
endpoint uses or the pool has not handed out yet."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import bpf, ctpool, loader, reaper
from cni.datapath import policy_install as P
from cni.datapath.maps import Datapath, ct_key, iterate
from cni.datapath.structs import CT_SHARES, NONE, CTKey
from cni.policy.vocabulary import AllowRule, EndpointPolicy, Ports
from tests.harness.agent import AgentNetwork, namespace, policy
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, node_veth


@pytest.fixture
def dp() -> Iterator[Datapath]:
    loader.ensure_loaded(TEST_BPF_DIR)
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def in_use(dp: Datapath) -> tuple[set[int], set[int]]:
    """(conntrack slots, policy ids) the endpoint entries name."""
    endpoints = dp.endpoints.all().values()
    slots = {ep.ct_slot for ep in endpoints} - {NONE}
    ids = {ep.egress_policy for ep in endpoints} | {ep.ingress_policy for ep in endpoints}
    return slots, ids - {NONE}


def assert_no_garbage(dp: Datapath) -> None:
    slots, ids = in_use(dp)
    assert not ctpool.dirty_tables(dp), "dirty tables"
    wanted = {ct_key(s, i) for s in slots | set(ctpool.free_tables(dp)) for i in CT_SHARES}
    assert set(dp.inner_maps("ct_tables")) == wanted, "stray tables, or a share missing"
    assert set(dp.inner_maps("peers")) == ids, "peer maps no endpoint uses"
    assert set(dp.inner_maps("rules")) == ids, "rule maps no endpoint uses"
    assert set(dp.policies.index().values()) == ids, "index entries no endpoint uses"


def test_add_and_del_take_and_give_back_a_table_without_writing_a_map_of_maps(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    """In-process ("policy": "off", no agent), with a stocked pool."""
    reaper.reap(dp, pool=4, stock=True)  # stocked, and the release counts start at 0
    free = ctpool.free_tables(dp)
    tables = dp.inner_maps("ct_tables")
    assert len(free) >= 4
    netns = pods.new()
    _, ifindex = node_veth(network.add(netns, "pooled"))
    slot = dp.endpoints.get(ifindex).ct_slot  # type: ignore[union-attr]
    assert slot in free, "the table came from the pool"
    assert dp.inner_maps("ct_tables") == tables, "ADD wrote ct_tables"
    network.delete(netns, "pooled").ok()
    assert dp.inner_maps("ct_tables") == tables, "DEL wrote ct_tables"
    assert slot in ctpool.dirty_tables(dp)
    # The reaper replaces the dirty table before it is handed out again.
    reaper.reap(dp, pool=len(free))
    assert slot not in ctpool.dirty_tables(dp)
    if slot in ctpool.free_tables(dp):
        assert dp.inner_maps("ct_tables")[slot] != tables[slot], "a fresh table"
        fd = bpf.map_get_fd_by_id(dp.inner_maps("ct_tables")[slot])
        try:
            assert not list(iterate(fd, CTKey)), "an empty one"
        finally:
            os.close(fd)


def test_the_reaper_deletes_all_garbage_and_nothing_in_use(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    made = {}
    for cid in ("a", "b", "c"):
        netns = pods.new()
        made[cid] = (netns, node_veth(network.add(netns, cid)))
    shared = EndpointPolicy(ingress=(AllowRule(ports=(Ports("tcp", 7001),)),))
    own = EndpointPolicy(egress=(AllowRule(ports=(Ports("udp", 7002),)),))
    registry = P.PolicyRegistry()
    P.install_many(dp, {made["a"][1][1]: shared, made["b"][1][1]: shared}, registry)
    P.install(dp, made["c"][1][1], own, registry)
    reaper.reap(dp, pool=2, stock=True)
    free = ctpool.free_tables(dp)

    def kept() -> dict[str, object]:
        """What must survive every pass: c's table and rule set, a free table."""
        c = dp.endpoints.get(made["c"][1][1])
        assert c is not None
        maps = {name: dp.inner_maps(name) for name in ("peers", "rules", "ct_tables")}
        return {
            "c's table": maps["ct_tables"][c.ct_slot],
            "c's peers": maps["peers"][c.egress_policy],
            "c's rules": maps["rules"][c.egress_policy],
            "free tables": {s: maps["ct_tables"][s] for s in free},
        }

    survivors = kept()
    # DEL: a's entry goes; its table is dirty, its rule set still b's.
    network.delete(made["a"][0], "a").ok()
    b = dp.endpoints.get(made["b"][1][1])
    assert b is not None and b.ingress_policy in dp.inner_maps("peers")
    reaper.reap(dp, pool=0)
    assert not ctpool.dirty_tables(dp)
    assert b.ingress_policy in dp.inner_maps("peers"), "b's rule set is in use"
    # A veth that vanished behind sluice's back, then GC: b's rule set is garbage now.
    subprocess.run(["ip", "link", "del", made["b"][1][0]], check=True)
    valid = [{"containerID": "c", "ifname": "eth0"}]
    network.run("GC", network.config(**{"cni.dev/valid-attachments": valid})).ok()
    assert dp.endpoints.get(made["b"][1][1]) is None
    assert b.ingress_policy not in dp.inner_maps("peers")
    assert_no_garbage(dp)
    assert kept() == survivors, "the reaper removed something in use or free"
    for cid in ("b", "c"):
        network.delete(made[cid][0], cid).ok()


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def test_add_and_del_through_the_agent_wait_for_no_grace_period(
    tmp_path: Path, bin_dir: Path, pods: PodNamespaces
) -> None:
    """The agent's reaper keeps the pool stocked; pods whose rule set the node has
    already are added and deleted without a write of a map of maps."""
    net = AgentNetwork.create(tmp_path, bin_dir)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    net.agent.extra = ("--metrics-address", f"127.0.0.1:{port}")
    free = 'sluice_conntrack_pool_tables{state="free"}'
    dirty = 'sluice_conntrack_pool_tables{state="dirty"}'
    requests = 'sluice_rcu_waits_total{thread="requests"}'
    try:
        net.start()
        net.apply(namespace("x", ns="x"), policy("x", "deny", podSelector={}))
        added = [(pods.new(), "first")]
        net.add(added[0][0], "first", "x", "first")  # installs the rule set
        deadline = time.monotonic() + 30
        while metric(port, free) < reaper.POOL_TARGET and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(port, free) >= reaper.POOL_TARGET, "the reaper stocked the pool"
        before = metric(port, requests)
        for i in range(3):
            netns = pods.new()
            net.add(netns, f"p{i}", "x", f"p{i}")
            added.append((netns, f"p{i}"))
        for netns, name in added:
            net.delete(netns, name, "x", name)
        assert metric(port, requests) == before, "a CNI call waited for a grace period"
        deadline = time.monotonic() + 30
        while metric(port, dirty) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(port, dirty) == 0, "the reaper refilled or deleted the dirty tables"
    finally:
        net.cleanup()
