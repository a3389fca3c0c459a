"""Rule sets shared by content: endpoints with equal rules share one policy id and its
inner maps, and installing a rule set the node has already writes no map of maps
(each such write costs an RCU grace period). Verdicts with BPF_PROG_TEST_RUN, the
outer maps' elements and the clock."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from cni.datapath import policy_install as P
from cni.datapath import rcu, reaper
from cni.datapath.maps import Datapath
from cni.datapath.structs import Endpoint, ip_be
from cni.policy.vocabulary import EndpointPolicy, Ports
from tests.harness import packets as pk
from tests.node.datapath.test_bpf_verdicts import A_IP, B_IP, DROP, PASS, PEER, Bench, bench, rule

__all__ = ["bench"]  # the fixture


def one_grace_period() -> float:
    """Seconds an RCU grace period takes here (median of three)."""
    samples = []
    for _ in range(3):
        started = time.perf_counter()
        assert rcu.wait_for_readers()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def my_waits() -> int:
    return rcu.waits_by_thread().get(threading.current_thread().name, 0)


def outer_maps(dp: Datapath) -> dict[str, dict[int, int]]:
    """Every element of the maps of maps: {map: {key: inner map id}}."""
    return {name: dp.inner_maps(name) for name in ("peers", "rules", "ct_tables")}


def policy_maps(dp: Datapath, policy_id: int) -> tuple[int, int]:
    """The inner maps' ids of a policy id: (peers, rules)."""
    return dp.inner_maps("peers")[policy_id], dp.inner_maps("rules")[policy_id]


def udp_out(src: str, sport: int, dport: int) -> bytes:
    return pk.eth(pk.ipv4(src, PEER, 17, pk.udp(sport, dport)))


def test_equal_rule_sets_share_one_policy_id_and_its_maps(bench: Bench) -> None:
    dns = (rule(f"{PEER}/32", Ports("udp", 53)),)
    bench.policy(bench.a, egress=dns)
    bench.policy(bench.b, egress=dns)
    a, b = bench.dp.endpoints.get(bench.a), bench.dp.endpoints.get(bench.b)
    assert a is not None and b is not None
    assert a.egress_policy == b.egress_policy != 0 and a.ingress_policy == b.ingress_policy == 0
    shared = b.egress_policy
    maps = policy_maps(bench.dp, shared)
    assert bench.out_of(bench.a, udp_out(A_IP, 4000, 53)) == PASS
    assert bench.out_of(bench.b, udp_out(B_IP, 4000, 53)) == PASS
    assert bench.out_of(bench.b, udp_out(B_IP, 4001, 54)) == DROP

    # A change to one endpoint leaves the other as it was.
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 54)),))
    a, b = bench.dp.endpoints.get(bench.a), bench.dp.endpoints.get(bench.b)
    assert a is not None and b is not None
    assert a.egress_policy not in (0, shared) and b.egress_policy == shared
    assert policy_maps(bench.dp, shared) == maps
    assert bench.out_of(bench.a, udp_out(A_IP, 4002, 53)) == DROP
    assert bench.out_of(bench.a, udp_out(A_IP, 4003, 54)) == PASS
    assert bench.out_of(bench.b, udp_out(B_IP, 4004, 53)) == PASS
    assert bench.out_of(bench.b, udp_out(B_IP, 4005, 54)) == DROP


def test_installing_a_rule_set_the_node_has_writes_no_map_of_maps(bench: Bench) -> None:
    dns = (rule(f"{PEER}/32", Ports("udp", 53)),)
    bench.policy(bench.a, egress=dns)  # the node has it now
    reaper.reap(bench.dp, full=True)  # nothing left to reap during the installs below
    wait = one_grace_period()
    before, waits = outer_maps(bench.dp), my_waits()
    took = []
    for _ in range(5):
        started = time.perf_counter()
        # A short-lived registry, as any process has: the pinned index finds the id.
        P.install(bench.dp, bench.b, EndpointPolicy(egress=dns))
        took.append(time.perf_counter() - started)
        P.install(bench.dp, bench.b, EndpointPolicy())
    assert outer_maps(bench.dp) == before, "an element of a map of maps was written"
    assert my_waits() == waits
    assert min(took) < wait / 4, f"{min(took) * 1000:.2f} ms, a grace period {wait * 1000:.1f} ms"


@pytest.fixture
def hundred(bench: Bench) -> Iterator[list[int]]:
    """100 endpoints (installs touch only maps: no device needs to exist)."""
    ifindexes = [0x7FFF0000 + i for i in range(100)]
    try:
        for i, ifindex in enumerate(ifindexes):
            bench.dp.endpoints.put(ifindex, Endpoint(ip=ip_be(f"10.78.{i // 250}.{i % 250 + 1}")))
        yield ifindexes
    finally:
        for ifindex in ifindexes:
            bench.dp.endpoints.delete(ifindex)
        reaper.reap(bench.dp)


def test_a_batch_of_100_endpoints_with_one_new_rule_set_waits_twice(
    bench: Bench, hundred: list[int]
) -> None:
    """One batched insert per outer map (peers, rules): two grace periods, not 200."""
    fresh = (rule(f"{PEER}/32", Ports("tcp", 4242)),)
    reaper.reap(bench.dp)  # the release counts start at 0: no reap within the install
    wait = one_grace_period()
    waits = my_waits()
    started = time.perf_counter()
    generations = P.install_many(
        bench.dp, dict.fromkeys(hundred, EndpointPolicy(ingress=fresh)), P.PolicyRegistry()
    )
    took = time.perf_counter() - started
    assert sorted(generations) == hundred
    ids = {bench.dp.endpoints.get(i).ingress_policy for i in hundred}  # type: ignore[union-attr]
    assert len(ids) == 1 and 0 not in ids
    assert my_waits() - waits == 2
    assert took < 10 * wait, f"{took * 1000:.0f} ms, a grace period {wait * 1000:.1f} ms"
