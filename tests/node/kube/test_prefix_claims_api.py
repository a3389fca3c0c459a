"""Prefix claims in a real Kubernetes API (etcd, kube-apiserver, kube-controller-manager
of the harness), with the agent's own claim code and its least-privilege RBAC.

Simulated nodes are Node objects without kubelets; each node's IPAM runs in a process
of its own (``tests/harness/claim_worker.py``: ``AgentClaims``, exactly as the agent
runs it), so contention is between real processes and real creates.
"""

from __future__ import annotations

import ipaddress
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.agent.prefix_claims import AgentClaims
from cni.kube import prefixclaims
from ipam import config as ipam_config
from ipam.errors import NoAddress
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator
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
from tests.harness.waiting import eventually

pytest_plugins = ["tests.harness.claims_fixtures"]
pytestmark = [pytest.mark.k8s, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
NETWORK = "claims-net"


def prefix_config(tmp_path: Path, node: str, pool: str, **ipam: Any) -> ipam_config.PrefixConfig:
    config = ipam_config.from_plugin(NETWORK, plugin(tmp_path, node, pool, **ipam))
    assert isinstance(config, ipam_config.PrefixConfig)
    return config


def node_name() -> str:
    return f"claims-{uuid.uuid4().hex[:8]}"


def plugin(tmp_path: Path, node: str, pool: str, **ipam: Any) -> dict[str, Any]:
    return {"stateDir": str(tmp_path / node), "ipam": prefix_ipam(pool, node, **ipam)}


def start_worker(kubeconfig: Path, job: dict[str, Any]) -> subprocess.Popen[str]:
    job = {"kubeconfig": str(kubeconfig), "network": NETWORK, **job}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.harness.claim_worker", json.dumps(job)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    (done,) = [line for line in lines if line.get("done")]
    done["committed"] = [line for line in lines if "ip" in line]
    return done


def held_in_store(state_dir: Path) -> list[str]:
    """The blocks a node's own store records (the truth of what it allocates from)."""
    import sqlite3

    with sqlite3.connect(state_dir / "ipam" / f"{NETWORK}.db") as db:
        return sorted((c for (c,) in db.execute("SELECT cidr FROM prefixes")), key=_net)


def _net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


@pytest.fixture
def nodes(claims_control_plane: Cluster) -> Iterator[list[str]]:
    """Node names to create; every one is deleted afterwards (its claims go with it)."""
    created: list[str] = []
    yield created
    for name in created:
        delete_node(claims_control_plane, name)


def new_nodes(cluster: Cluster, created: list[str], count: int) -> list[str]:
    names = [node_name() for _ in range(count)]
    for name in names:
        create_node(cluster, name)
        created.append(name)
    return names


def assert_disjoint(cluster: Cluster, pool: str, results: dict[str, dict[str, Any]]) -> None:
    """No block held by two nodes, every node's records are its claims (no leak, none
    missing), every address inside its node's blocks and handed out once."""
    objects = claim_objects(cluster, pool)
    names = [o["metadata"]["name"] for o in objects]
    assert len(names) == len(set(names))
    by_node = claims_by_node(cluster, pool)
    blocks = [b for held in by_node.values() for b in held]
    assert len(blocks) == len(set(blocks)), f"a block is claimed twice: {by_node}"
    for a, b in ((x, y) for i, x in enumerate(blocks) for y in blocks[i + 1 :]):
        assert not _net(a).overlaps(_net(b)), f"{a} overlaps {b}"
    everything: list[str] = []
    for node, result in results.items():
        assert result["held"] == by_node.get(node, []), f"{node}: records and claims differ"
        for ip in result["ips"]:
            owner = [b for b in result["held"] if ipaddress.IPv4Address(ip) in _net(b)]
            assert owner, f"{node} allocated {ip} outside its blocks {result['held']}"
        everything += result["ips"]
    assert len(everything) == len(set(everything)), "an address was handed out twice"


def test_no_block_is_claimed_twice_when_every_node_claims_at_once(
    claims_control_plane: Cluster, agent_kubeconfig: Path, nodes: list[str], tmp_path: Path
) -> None:
    """Six nodes, each a process with two threads of ADDs, released at once onto one
    pool: every block has one holder, and nodes that lost a create moved on."""
    cluster = claims_control_plane
    conflicts = 0
    for round_ in range(3):  # until a round has had contention (the first nearly always)
        pool = unique_pool()
        names = new_nodes(cluster, nodes, 6)
        workers = {
            name: start_worker(
                agent_kubeconfig,
                {
                    "plugin": plugin(
                        tmp_path / f"r{round_}", name, pool, warmPrefixes=1, cooldownSeconds=0
                    ),
                    "count": 40,
                    "threads": 2,
                    "prefix": name,
                    "barrier": True,
                },
            )
            for name in names
        }
        for proc in workers.values():  # every worker has listed the claims
            assert proc.stdout is not None
            assert "ready" in json.loads(proc.stdout.readline())
        for proc in workers.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = {name: finish(proc) for name, proc in workers.items()}
        for name, result in results.items():
            assert result["errors"] == [], result["errors"]
            assert len(result["ips"]) == 40
            assert held_in_store(tmp_path / f"r{round_}" / name) == result["held"]
        assert_disjoint(cluster, pool, results)
        # 40 addresses fill 3 blocks of 16 but for 8, less than the warm reserve of one
        # block: a 4th is held empty.
        assert all(len(r["held"]) == 4 for r in results.values())
        conflicts += sum(r["conflicts"] for r in results.values())
        if conflicts:
            break
    assert conflicts > 0, "the nodes never raced for a block"

    # The objects as the route keeper reads them: holder label, spec, owner.
    node = names[0]
    uid = cluster.kubectl_json("get", "node", node)["metadata"]["uid"]
    (obj, *_) = [o for o in claim_objects(cluster, pool) if o["spec"]["node"] == node]
    assert obj["metadata"]["labels"] == {
        prefixclaims.NODE_LABEL: node,
        prefixclaims.POOL_LABEL: pool.replace("/", "-"),
    }
    assert obj["metadata"]["name"] == obj["spec"]["prefix"].replace("/", "-")
    assert obj["spec"]["pool"] == pool and obj["spec"]["network"] == NETWORK
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
    ]
    selected = cluster.kubectl_json(
        "get", "prefixclaims", "-l", f"{prefixclaims.NODE_LABEL}={node}"
    )["items"]
    assert (
        sorted((o["spec"]["prefix"] for o in selected), key=_net)
        == claims_by_node(cluster, pool)[node]
    )


def test_a_killed_agent_readopts_its_claims_and_leaks_none(
    claims_control_plane: Cluster, agent_kubeconfig: Path, nodes: list[str], tmp_path: Path
) -> None:
    """SIGKILL while claiming, at random points, then a restart: the node holds the
    blocks it held (none new, none lost); releasing everything leaves no claim."""
    cluster = claims_control_plane
    pool = unique_pool()
    (node,) = new_nodes(cluster, nodes, 1)
    job = {
        "plugin": plugin(tmp_path, node, pool, warmPrefixes=1, cooldownSeconds=0),
        "threads": 2,
    }
    for round_ in range(4):
        proc = start_worker(agent_kubeconfig, {**job, "count": -1, "prefix": f"k{round_}"})
        time.sleep(random.uniform(1.5, 3.0))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        committed = [json.loads(line)["ip"] for line in out.splitlines() if '"ip"' in line]
        time.sleep(0.5)  # a create the killed process sent still lands
        claimed = claims_by_node(cluster, pool).get(node, [])
        restarted = finish(start_worker(agent_kubeconfig, {**job, "count": 0}))
        # Nothing committed is lost; only blocks it held before, of which the restart
        # kept what its addresses and the warm reserve need.
        assert set(committed) <= set(restarted["ips"])
        assert set(restarted["held"]) <= set(claimed), (claimed, restarted["held"])
        assert restarted["held"] == claims_by_node(cluster, pool).get(node, [])
        assert held_in_store(tmp_path / node) == restarted["held"]
        assert_disjoint(cluster, pool, {node: restarted})
    released = finish(start_worker(agent_kubeconfig, {**job, "count": 0, "release": True}))
    assert released["ips"] == [] and len(released["held"]) == 1  # the warm block
    assert claims_by_node(cluster, pool)[node] == released["held"]


def test_a_claim_made_but_never_used_is_given_back_at_start(
    claims_control_plane: Cluster, agent_kubeconfig: Path, nodes: list[str], tmp_path: Path
) -> None:
    """A crash between the create of a claim and its record in the node's store: the
    next start adopts the claim and, not needing it, gives it back."""
    cluster = claims_control_plane
    pool = unique_pool()
    (node,) = new_nodes(cluster, nodes, 1)
    job = {"plugin": plugin(tmp_path, node, pool, warmPrefixes=0, cooldownSeconds=0)}
    first = finish(start_worker(agent_kubeconfig, {**job, "count": 3}))
    assert len(first["held"]) == 1
    # What the crashed agent created: a claim of the next block, owned by the Node.
    uid = cluster.kubectl_json("get", "node", node)["metadata"]["uid"]
    blocks = ipaddress.IPv4Network(pool).subnets(new_prefix=28)
    block = next(b for b in blocks if str(b) not in first["held"])
    apply(cluster, prefixclaims.claim_object(block, _net(pool), node, uid, NETWORK))
    assert str(block) in claims_by_node(cluster, pool)[node]
    restarted = finish(start_worker(agent_kubeconfig, {**job, "count": 0}))
    assert restarted["held"] == first["held"] and restarted["ips"] == first["ips"]
    eventually(
        lambda: claims_by_node(cluster, pool)[node] == first["held"],
        "the unused claim is deleted",
    )


@pytest.fixture
def in_process_claims(agent_kubeconfig: Path) -> Iterator[list[AgentClaims]]:
    """AgentClaims started in this process; stopped afterwards."""
    started: list[AgentClaims] = []
    yield started
    for claims in started:
        claims.stop()


def start_claims(
    started: list[AgentClaims], kubeconfig: Path, config: ipam_config.PrefixConfig
) -> AgentClaims:
    claims = AgentClaims(config, str(kubeconfig))
    started.append(claims)
    claims.start()
    assert claims.store.synced.is_set()
    return claims


def test_given_back_blocks_wait_out_their_cooldown_and_may_be_taken_back(
    claims_control_plane: Cluster,
    agent_kubeconfig: Path,
    nodes: list[str],
    tmp_path: Path,
    in_process_claims: list[AgentClaims],
) -> None:
    cluster = claims_control_plane
    pool = unique_pool()
    (node,) = new_nodes(cluster, nodes, 1)
    cooldown = 4.0
    config = prefix_config(tmp_path, node, pool, warmPrefixes=0, cooldownSeconds=cooldown)
    claims = start_claims(in_process_claims, agent_kubeconfig, config)
    with open_allocator(config) as allocator:
        assert isinstance(allocator, PrefixAllocator)
        for i in range(17):
            allocator.allocate(f"c{i}", "eth0")
        first, second = (str(b) for b in sorted(allocator.reconcile()))
        allocator.release("c16", "eth0")  # the second block is empty once .16 cooled
        time.sleep(cooldown + 0.5)
        assert [str(b) for b in allocator.reconcile()] == [first]
        (obj,) = [o for o in claim_objects(cluster, pool) if o["spec"]["prefix"] == second]
        assert obj["spec"]["releasedAt"]  # given back, still there: nobody else may take it
        uid = obj["metadata"]["uid"]
        assert claims.store.sweep() == 0  # its own cooldown is not over
        allocator.allocate("again", "eth0")  # needs a block: takes the same one back
        (back,) = [o for o in claim_objects(cluster, pool) if o["spec"]["prefix"] == second]
        assert back["metadata"]["uid"] == uid and "releasedAt" not in back["spec"]
        allocator.release("again", "eth0")
        time.sleep(cooldown + 0.5)
        allocator.reconcile()
    eventually(
        lambda: claims_by_node(cluster, pool)[node] == [first],
        "the given-back claim is deleted after its cooldown",
        timeout=30,
    )


def test_deleting_a_node_garbage_collects_its_claims(
    claims_control_plane: Cluster,
    agent_kubeconfig: Path,
    nodes: list[str],
    tmp_path: Path,
    in_process_claims: list[AgentClaims],
) -> None:
    cluster = claims_control_plane
    pool = unique_pool()
    gone, stays = new_nodes(cluster, nodes, 2)
    for node in (gone, stays):
        config = prefix_config(tmp_path, node, pool, warmPrefixes=1)
        start_claims(in_process_claims, agent_kubeconfig, config)
        with open_allocator(config) as allocator:
            allocator.allocate("c0", "eth0")
        for claims in in_process_claims:
            claims.stop()
        in_process_claims.clear()
    before = claims_by_node(cluster, pool)
    assert len(before[gone]) == 2 and len(before[stays]) == 2
    delete_node(cluster, gone)
    # kube-controller-manager's garbage collector (it may first have to discover the
    # CRD: discovery is refreshed every 30 s).
    eventually(
        lambda: gone not in claims_by_node(cluster, pool),
        "the deleted node's claims are garbage-collected",
        timeout=120,
        interval=1,
    )
    assert claims_by_node(cluster, pool)[stays] == before[stays]


def test_a_fragmented_pool_is_reported_on_the_node(
    claims_control_plane: Cluster,
    agent_kubeconfig: Path,
    nodes: list[str],
    tmp_path: Path,
    in_process_claims: list[AgentClaims],
) -> None:
    """Free addresses but no free aligned block: the ADD says so, an Event on the Node
    says so, and the metric gives the largest free aligned block."""
    cluster = claims_control_plane
    pool = str(next(_net(unique_pool()).subnets(new_prefix=26)))  # 4 blocks of /28
    mine, other = new_nodes(cluster, nodes, 2)
    configs = {node: prefix_config(tmp_path, node, pool, warmPrefixes=0) for node in (mine, other)}
    other_claims = start_claims(in_process_claims, agent_kubeconfig, configs[other])
    with open_allocator(configs[other]) as allocator:
        for i in range(35):  # 3 blocks: 16 + 16 + 3
            allocator.allocate(f"o{i}", "eth0")
    other_claims.store.stop()  # publishes the usage
    claims = start_claims(in_process_claims, agent_kubeconfig, configs[mine])
    eventually(lambda: sum(c.used for c in claims.store.claims()) == 35, "the other node's usage")
    with open_allocator(configs[mine]) as allocator:
        for i in range(16):
            allocator.allocate(f"m{i}", "eth0")
        with pytest.raises(NoAddress) as err:
            allocator.allocate("one-more", "eth0")
    largest = f"{ipaddress.IPv4Network(pool)[32 + 8]}/29"  # in the other's third block
    message = (
        f"pool {pool} has 13 free addresses but no free aligned /28 "
        f"(the largest free aligned block is {largest})"
    )
    assert str(err.value) == message

    def event() -> dict[str, Any] | None:
        found = [e for e in node_events(cluster, mine) if e["reason"] == "PrefixPoolFragmented"]
        return found[0] if found else None

    posted = eventually(event, "a PrefixPoolFragmented Event on the Node")
    assert posted["type"] == "Warning" and posted["message"] == message
    assert (
        posted["involvedObject"]["uid"]
        == cluster.kubectl_json("get", "node", mine)["metadata"]["uid"]
    )
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in claims.collector().collect()
        for s in family.samples
    }
    network = (("network", NETWORK),)
    assert metrics[("sluice_ipam_largest_free_aligned_block_addresses", network)] == 8
    reason = (("network", NETWORK), ("reason", "fragmented"))
    assert metrics[("sluice_ipam_no_free_block_total", reason)] == 1
