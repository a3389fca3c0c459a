"""The eBPF datapath with real packets between pod namespaces.

Pods are wired by the real plugin ("policy": "off": programs attached, no
endpoint isolated); rules are written through the Python datapath API
(cni.datapath.policy_install), as the node agent will. Counters are node-wide, so
tests compare them before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import bpf, loader, settings
from cni.datapath import policy_install as P
from cni.datapath.attach import HOOKS, link_path
from cni.datapath.endpoint_check import pinned_programs
from cni.datapath.events import follow
from cni.datapath.maps import Datapath, DatapathMismatch
from cni.policy.vocabulary import (
    Action,
    EndpointPolicy,
    PeerCIDR,
    PolicyError,
    Ports,
    Tier,
    TierRule,
)
from cni.spec.errors import CNIError
from tests.harness.cni_run import (
    SLUICECTL,
    TEST_BPF_DIR,
    Network,
    PodNamespaces,
    in_netns,
    node_veth,
    ping,
    sluicectl,
)
from tests.harness.datapath_pods import (
    PROBE,
    PYTHON,
    HeldConnection,
    Pod,
    Server,
    allow,
    rule,
    tcp,
    wired_pods,
)


@pytest.fixture
def trio(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    """Three pods a, b, c on one network."""
    with wired_pods(network, pods, "abc") as made:
        yield made


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    return {d: {r: after[d][r] - before[d][r] for r in after[d]} for d in after}


# -- policy semantics ------------------------------------------------------------------


def test_unisolated_pods_pass_and_are_counted(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    before = dp.counters()
    assert ping(a.netns, b.ip)
    moved = delta(before, dp.counters())
    assert moved["egress"]["allowed"] >= 1 and moved["ingress"]["allowed"] >= 1
    assert moved["egress"]["allowed-reply"] >= 1
    assert sum(moved["ingress"][r] for r in ("denied-policy", "drop-spoofed")) == 0


def test_allow_by_peer_cidr_protocol_and_port(trio: list[Pod], dp: Datapath) -> None:
    a, b, c = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),)))))
    with Server(b, tcp=(8080, 8081)):
        assert a.connects(b, 8080)
        assert not a.connects(b, 8081), "a port no rule names"
        assert not c.connects(b, 8080), "a peer no rule names"
        assert not ping(a.netns, b.ip), "a protocol no rule names"
    assert ping(b.netns, a.ip), "b's egress is not isolated; the reply is allowed"


def test_port_ranges_and_any_protocol(trio: list[Pod], dp: Datapath) -> None:
    a, b, c = trio
    P.install(
        dp,
        b.ifindex,
        EndpointPolicy(
            ingress=allow(
                rule(f"{a.ip}/32", ports=(tcp(9000, 9010),)),
                rule(f"{c.ip}/32"),  # no ports: everything
            )
        ),
    )
    with Server(b, tcp=(9000, 9005, 9010, 9011)):
        assert a.connects(b, 9000) and a.connects(b, 9005) and a.connects(b, 9010)
        assert not a.connects(b, 9011)
        assert c.connects(b, 9011)
    assert ping(c.netns, b.ip) and not ping(a.netns, b.ip)


def test_udp_and_the_whole_port_range(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(
        dp,
        b.ifindex,
        EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(Ports("udp", 1, 65535),)))),
    )
    with Server(b, tcp=(5300,), udp=(5300,)):
        assert a.probe("udp-ask", b.ip, 5300) == 0
        assert not a.connects(b, 5300), "TCP is not UDP"


def test_ip_block_except(trio: list[Pod], dp: Datapath, network: Network) -> None:
    a, b, c = trio
    P.install(
        dp,
        b.ifindex,
        EndpointPolicy(
            ingress=allow(rule(network.subnet, ports=(tcp(8080),), excepts=(f"{a.ip}/32",)))
        ),
    )
    with Server(b, tcp=(8080,)):
        assert c.connects(b, 8080)
        assert not a.connects(b, 8080)


def test_egress_isolation_and_replies(trio: list[Pod], dp: Datapath) -> None:
    """b may only receive from a: b's answers pass, b's own connections do not."""
    a, b, c = trio
    P.install(
        dp,
        b.ifindex,
        EndpointPolicy(
            ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),))),
            egress=allow(),  # isolated, nothing allowed
        ),
    )
    with Server(b, tcp=(8080,)), Server(a, tcp=(8081,)):
        assert a.connects(b, 8080), "replies of an allowed flow pass b's egress"
        assert not b.connects(a, 8081)
        assert not ping(b.netns, c.ip)


def test_node_reaches_isolated_pods_unless_denied(trio: list[Pod], dp: Datapath) -> None:
    _, b, _ = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow()))
    assert ping(None, b.ip), "kubelet probes come from the node"
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow(), deny_node=True))
    assert not ping(None, b.ip)


def test_spoofed_source_is_dropped(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    in_netns(a.netns, "ip", "addr", "add", "10.254.254.254/32", "dev", "eth0", check=True)
    before = dp.counters()
    with Server(b, udp=(5400,)) as server:
        in_netns(
            a.netns,
            PYTHON,
            "-c",
            "import socket; s = socket.socket(2, 2); "
            "s.bind(('10.254.254.254', 0)); "
            f"[s.sendto(b'x', ('{b.ip}', 5400)) for _ in range(5)]",
            check=True,
        )
        time.sleep(0.3)
    assert server.counts["udp"]["5400"] == 0
    assert delta(before, dp.counters())["egress"]["drop-spoofed"] == 5


def test_arp_only_with_the_pods_own_address(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    before = dp.counters()
    assert a.probe("arp", a.ip, b.ip) == 0
    assert a.probe("arp", "10.254.254.253", b.ip) == 0
    moved = delta(before, dp.counters())["egress"]
    assert moved["drop-spoofed"] == 1 and moved["allowed"] >= 1


def test_ip_options_do_not_hide_the_ports(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(
        dp,
        b.ifindex,
        EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(Ports("udp", 5500),)))),
    )
    before = dp.counters()
    with Server(b, udp=(5500, 5501)) as server:
        assert a.probe("options", b.ip, 5500) == 0
        assert a.probe("options", b.ip, 5501) == 0
        time.sleep(0.3)
    assert server.counts["udp"] == {"5500": 1, "5501": 0}
    assert delta(before, dp.counters())["ingress"]["denied-policy"] == 1


def test_fragments_follow_their_first_fragment(trio: list[Pod], dp: Datapath) -> None:
    """Judged where the pod sends them (the node may reassemble what it forwards)."""
    a, b, _ = trio
    P.install(
        dp,
        a.ifindex,
        EndpointPolicy(egress=allow(rule(f"{b.ip}/32", ports=(Ports("udp", 5600),)))),
    )
    before = dp.counters()
    with Server(b, udp=(5600, 5601)) as server:
        assert a.probe("big-udp", b.ip, 5600, 4000) == 0  # three fragments, reassembled in b
        assert a.probe("big-udp", b.ip, 5601, 4000) == 0
        # A later fragment alone, its payload shaped like a UDP header to the allowed port.
        assert a.probe("fragment", a.ip, b.ip, 5600) == 0
        time.sleep(0.3)
    assert server.counts["udp"] == {"5600": 1, "5601": 0}
    moved = delta(before, dp.counters())["egress"]
    assert moved["denied-policy"] == 1  # the first fragment to 5601
    assert moved["drop-fragment"] == 3  # 5601's two later fragments and the lone one


def test_icmp_errors_about_allowed_flows_pass(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(
        dp,
        a.ifindex,
        EndpointPolicy(
            ingress=allow(),
            egress=allow(rule(f"{b.ip}/32", ports=(Ports("udp", 5700),))),
        ),
    )
    # Nothing listens on b:5700, so b answers with ICMP port unreachable.
    assert a.probe("udp-refused", b.ip, 5700) == 0


def test_unparseable_traffic_from_an_isolated_pod_is_dropped(trio: list[Pod], dp: Datapath) -> None:
    a, _, _ = trio
    P.install(dp, a.ifindex, EndpointPolicy(egress=allow(rule("0.0.0.0/0"))))
    before = dp.counters()
    in_netns(a.netns, "ping", "-6", "-c", "2", "-W", "1", "-i", "0.2", "ff02::1%eth0")
    assert delta(before, dp.counters())["egress"]["drop-unsupported"] >= 2


def test_conntrack_entries_expire(trio: list[Pod], dp: Datapath) -> None:
    """b answers twice: within the UDP timeout (a reply) and after it (a new flow out of
    b, whose egress allows nothing)."""
    a, b, _ = trio
    dp.set_config(ct_udp=1)
    answer_twice = (
        "import socket, time\n"
        "s = socket.socket(2, 2); s.bind(('0.0.0.0', 5800)); print('ready', flush=True)\n"
        "data, peer = s.recvfrom(16); s.sendto(b'one', peer)\n"
        "time.sleep(2.5); s.sendto(b'two', peer)\n"
    )
    ask = (
        "import socket\n"
        "s = socket.socket(2, 2); s.bind(('0.0.0.0', 40000)); s.settimeout(4)\n"
        f"s.sendto(b'x', ('{b.ip}', 5800)); got = [s.recv(16)]\n"
        "try:\n    got.append(s.recv(16))\nexcept TimeoutError:\n    pass\n"
        "print(b','.join(got).decode())\n"
    )
    try:
        P.install(
            dp,
            b.ifindex,
            EndpointPolicy(
                ingress=allow(rule(f"{a.ip}/32", ports=(Ports("udp", 5800),))), egress=allow()
            ),
        )
        server = subprocess.Popen(
            ["ip", "netns", "exec", Path(b.netns).name, PYTHON, "-c", answer_twice],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        before = dp.counters()
        got = in_netns(a.netns, PYTHON, "-c", ask, timeout=20).stdout.strip()
        server.wait(timeout=10)
    finally:
        dp.set_config(ct_udp=60)
    assert got == "one"
    moved = delta(before, dp.counters())["egress"]
    assert moved["allowed-reply"] == 1 and moved["denied-policy"] == 1


# -- counters and events ------------------------------------------------------------------


def test_deny_events_are_streamed_and_rate_limited(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow()))
    for _ in follow(dp.path("events"), timeout=0.1):
        pass  # drain what earlier tests left
    dp.set_config(events_per_second=5, events_burst=5)
    started = time.monotonic()
    try:
        assert a.probe("udp", b.ip, 6000, "--count", 60) == 0
        events = list(follow(dp.path("events"), timeout=0.5))
    finally:
        dp.set_config(events_per_second=100, events_burst=200)
    # Every drop (the 60 denied datagrams, and the pods' and the node's IPv6, which
    # is dropped too) draws on one budget per CPU: a burst of 5 plus 5 a second.
    cpus = os.cpu_count() or 1
    bound = cpus * (5 + 5 * (time.monotonic() - started))
    assert bound < 60, "too slow a run to show the limit"
    assert 1 <= len(events) <= bound
    # The node's own IPv6 frames into the isolated pod are denied too (drop-unsupported).
    event = next(e for e in events if e.reason != "drop-unsupported")
    assert (event.source, event.destination, event.dport) == (a.ip, b.ip, 6000)
    assert (event.protocol, event.direction, event.reason) == ("udp", "ingress", "denied-policy")
    assert event.ifindex == b.ifindex


# -- atomic updates and cut flows ----------------------------------------------------------


def test_policy_swap_is_atomic_under_continuous_traffic(trio: list[Pod], dp: Datapath) -> None:
    """Two policies both allow 7000 and both deny 7003; while they replace each other many
    times, every packet to 7000 passes and none to 7003 does (new flow each packet)."""
    a, b, _ = trio
    first = EndpointPolicy(
        ingress=allow(
            rule(f"{a.ip}/32", ports=(Ports("udp", 7000), Ports("udp", 7001))),
            rule("10.0.0.0/8", ports=(Ports("udp", 7100, 7200),)),
        )
    )
    second = EndpointPolicy(
        ingress=allow(
            rule(f"{a.ip}/32", ports=(Ports("udp", 7000), Ports("udp", 7002))),
            rule("172.16.0.0/12", ports=(tcp(1, 65535),)),
        )
    )
    P.install(dp, b.ifindex, first)
    stop = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        while not stop.is_set():
            P.install(dp, b.ifindex, second if swaps % 2 == 0 else first)
            swaps += 1

    before = dp.counters()
    swapper = threading.Thread(target=swap)
    with Server(b, udp=(7000, 7003)) as server:
        swapper.start()
        try:
            out = in_netns(
                a.netns, PYTHON, PROBE, "udp-stream", b.ip, "7000,7003", "3", check=True
            ).stdout
        finally:
            stop.set()
            swapper.join()
        time.sleep(0.5)
    sent = {int(port): count for port, count in json.loads(out).items()}
    moved = delta(before, dp.counters())["ingress"]
    assert (
        swaps > 20 and sent[7003] > 300
    )  # enough new flows to catch a torn swap, even on a loaded machine
    assert server.counts["udp"]["7003"] == 0
    assert moved["denied-policy"] == sent[7003], "exactly the 7003 packets were denied"
    assert server.counts["udp"]["7000"] == sent[7000]


def test_a_new_policy_cuts_flows_it_denies(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),)))))
    with Server(b, tcp=(8080,)):
        connection = HeldConnection(a, b, 8080)
        before = dp.counters()
        P.install(
            dp, b.ifindex, EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(9999),))))
        )
        assert connection.finish() == "cut"
    assert delta(before, dp.counters())["ingress"]["drop-flow-cut"] >= 1


# -- lifecycle: DEL, reload, CHECK -------------------------------------------------------------


def test_a_policy_with_tiers_is_refused_and_the_live_one_stays(
    trio: list[Pod], dp: Datapath
) -> None:
    """The datapath compiles no cluster-wide tiers yet: such an endpoint policy is
    refused whole, never installed without its tiers, and the live one keeps judging."""
    a, b, c = trio
    live = EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),))))
    generation = P.install(dp, b.ifindex, live)
    accept_c = Tier("security", ingress=(TierRule(Action.ACCEPT, (PeerCIDR(f"{c.ip}/32"),)),))
    failed: dict[int, PolicyError] = {}
    installed = P.install_many(
        dp, {b.ifindex: EndpointPolicy(ingress=(), before=(accept_c,))}, failed=failed
    )
    assert installed == {} and "tiers 'security'" in str(failed[b.ifindex])
    assert dp.endpoints.get(b.ifindex).policy_gen == generation  # type: ignore[union-attr]
    with Server(b, tcp=(8080,)):
        assert a.connects(b, 8080)
        assert not c.connects(b, 8080), "the refused tier's Accept is not in force"


def test_del_leaves_no_stale_entries(network: Network, pods: PodNamespaces, dp: Datapath) -> None:
    netns, peer_ns = pods.new(), pods.new()
    result = network.add(netns, "x")
    network.add(peer_ns, "y")
    _, ifindex = node_veth(result)
    P.install(dp, ifindex, EndpointPolicy(ingress=allow(rule("0.0.0.0/0"))))
    assert ping(peer_ns, result["ips"][0]["address"].split("/")[0])

    def entries() -> dict[str, bool]:
        """Each kind of state the endpoint has in the datapath: present or not."""
        ep = dp.endpoints.get(ifindex)
        return {
            "endpoint": ep is not None,
            "policy maps": ep is not None and ep.ingress_policy in dp.policies.ids(),
            "conntrack table": ifindex in dp.conntrack.tables(),
            "address": ifindex in dp.endpoints.ips().values(),
            "links": any(Path(link_path(TEST_BPF_DIR, ifindex, p)).exists() for p in HOOKS),
        }

    assert dp.conntrack.flows(ifindex)
    assert all(entries().values()), entries()  # so the check below is not vacuous
    network.delete(netns, "x").ok()
    assert not any(entries().values()), entries()
    network.delete(peer_ns, "y").ok()


def test_reload_keeps_maps_and_established_flows(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),)))))
    old = pinned_programs(dp)
    with Server(b, tcp=(8080,)):
        connection = HeldConnection(a, b, 8080)
        endpoints = {i: (e.ip, e.policy_gen, e.flags) for i, e in dp.endpoints.all().items()}
        flows = len(dp.conntrack.flows(b.ifindex))
        assert loader.load(TEST_BPF_DIR, force=True)
        assert connection.finish() == "echo", "the established flow survived the reload"
        assert a.connects(b, 8080) and not a.connects(b, 8081)
    new = pinned_programs(dp)
    assert set(old.values()).isdisjoint(new.values()), "new programs are pinned"
    pinned = sorted(p.name for p in Path(TEST_BPF_DIR).iterdir())
    assert [n for n in pinned if n.startswith("source_")] == [
        f"source_{loader.source_hash(TEST_BPF_DIR)}"
    ]
    assert not [n for n in pinned if n.endswith("_new")], "no staging pin is left"
    assert {i: (e.ip, e.policy_gen, e.flags) for i, e in dp.endpoints.all().items()} == endpoints
    assert len(dp.conntrack.flows(b.ifindex)) >= flows


def test_reload_and_del_after_a_veth_vanished(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    netns = pods.new()
    result = network.add(netns, "gone")
    veth, ifindex = node_veth(result)
    subprocess.run(["ip", "link", "del", veth], check=True)  # behind sluice's back
    assert loader.load(TEST_BPF_DIR, force=True)  # its severed links do not stop a reload
    assert dp.endpoints.get(ifindex) is None
    assert not Path(link_path(TEST_BPF_DIR, ifindex, "from_pod")).exists()
    network.delete(netns, "gone").ok()


def test_check_notices_a_missing_program_or_entry(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    _, ifindex = node_veth(result)
    network.check(netns, "c1", result).ok()
    # Unpinning a tcx link detaches its program.
    Path(link_path(TEST_BPF_DIR, ifindex, "to_pod")).unlink()
    run = network.check(netns, "c1", result)
    assert run.error_code == 101 and "to_pod" in run.out["details"]
    network.delete(netns, "c1").ok()

    result = network.add(netns, "c2")
    _, ifindex = node_veth(result)
    dp.endpoints.delete(ifindex)
    run = network.check(netns, "c2", result)
    assert run.error_code == 101 and "endpoint entry" in run.out["details"]
    network.delete(netns, "c2").ok()


def test_gc_sweeps_endpoints_whose_veth_is_gone(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    netns = pods.new()
    result = network.add(netns, "c1")
    veth, ifindex = node_veth(result)
    subprocess.run(["ip", "link", "del", veth], check=True)  # gone behind sluice's back
    assert dp.endpoints.get(ifindex) is not None
    network.run(
        "GC",
        network.config(**{"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]}),
    ).ok()
    assert dp.endpoints.get(ifindex) is None
    network.delete(netns, "c1").ok()


def test_sluicectl_datapath_views(trio: list[Pod], dp: Datapath) -> None:
    a, b, _ = trio
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow()))
    assert not ping(a.netns, b.ip)
    shown = json.loads(
        sluicectl("datapath", "show", "--bpf-dir", TEST_BPF_DIR, "-o", "json").stdout
    )
    mine = {ep["ifindex"]: ep for ep in shown["endpoints"]}[b.ifindex]
    assert mine["ip"] == b.ip and mine["isolated"] == ["ingress"] and mine["veth"] == b.veth
    assert mine["attached"] == ["from_pod", "to_pod"] and shown["current"]
    assert mine["ips"] == [b.ip] and mine["conntrack"]["max"] == 2 * 4096
    assert {"entries", "inbound", "created", "removed", "evicted"} <= set(mine["conntrack"])
    table = sluicectl("datapath", "show", "--bpf-dir", TEST_BPF_DIR).stdout
    assert "conntrack " in table and "evicted" in table
    counters = json.loads(
        sluicectl("datapath", "counters", "--bpf-dir", TEST_BPF_DIR, "-o", "json").stdout
    )
    assert counters["ingress"]["denied-policy"] >= 1
    monitor = subprocess.Popen(
        [
            SLUICECTL,
            "datapath",
            "monitor",
            "--bpf-dir",
            TEST_BPF_DIR,
            "--count",
            "1",
            "--timeout",
            "10",
            "-o",
            "json",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)  # let it open the ring buffer and skip what is queued
    for _ in range(20):
        if monitor.poll() is not None:
            break
        assert a.probe("udp", b.ip, 6100) == 0
        time.sleep(0.2)
    out, _ = monitor.communicate(timeout=20)
    event = json.loads(out.splitlines()[-1])
    assert event["reason"] == "denied-policy" and event["destination"] == b.ip


def test_policy_compilation_merges_nested_prefixes() -> None:
    compiled = P.compile_direction(
        [
            rule("10.0.0.0/8", ports=(tcp(80),)),
            rule("10.1.0.0/16", ports=(tcp(443),), excepts=("10.1.2.0/24",)),
        ]
    )
    sets = {str(prefix): set_id for prefix, set_id in compiled.peers.items()}
    wide, narrow, hole = sets["10.0.0.0/8"], sets["10.1.0.0/16"], sets["10.1.2.0/24"]
    assert len({wide, narrow}) == 2 and hole == wide  # the hole still matches the /8 rule
    ports = {(s, port) for (s, _, port) in compiled.rules}
    assert {(narrow, 80), (narrow, 443), (wide, 80)} <= ports
    assert (wide, 443) not in ports


def test_compiling_ten_thousand_peers_is_fast() -> None:
    rules = [
        rule(f"172.16.{i // 256}.{i % 256}/32", ports=(tcp(1000 + i % 50),)) for i in range(10000)
    ]
    started = time.monotonic()
    compiled = P.compile_direction(rules)
    assert time.monotonic() - started < 10
    assert len(compiled.peers) == 10000 and compiled.size == 20000


# -- upgrades and settings ---------------------------------------------------------------------


def test_a_datapath_of_another_layout_is_refused_then_replaced(tmp_path: Path) -> None:
    """Maps pinned by an older build (here: an endpoints map with another value size and
    no layout marker) are never reused with the wrong sizes."""
    old = f"{TEST_BPF_DIR}-old"
    os.makedirs(old)
    try:
        fd = bpf.map_create(bpf.MAP_TYPE_HASH, 4, 12, 16, name="endpoints")
        try:
            bpf.obj_pin(fd, os.path.join(old, "endpoints"))
        finally:
            os.close(fd)
        with pytest.raises(CNIError, match="--replace"):
            loader.load(old)
        with pytest.raises(CNIError, match="layout"):
            loader.ensure_loaded(old)
        with pytest.raises(DatapathMismatch, match="12"), Datapath(old) as stale:
            stale.fd("endpoints")
        conf = tmp_path / "net.conflist"
        plugin = {"type": "sluice", "bpfDir": old, "datapath": {"conntrackPerEndpoint": 512}}
        conf.write_text(json.dumps({"cniVersion": "1.1.0", "name": "n", "plugins": [plugin]}))
        loaded = sluicectl("datapath", "load", "--conf", conf, "--replace")
        assert loaded.returncode == 0, loaded.stderr
        assert loader.pinned_layout(old) == loader.layout_hash(settings.from_plugin(plugin))
        with Datapath(old) as fresh:
            assert fresh.config().ct_per_endpoint == 512 and fresh.endpoints.all() == {}
        plugin["datapath"] = {"maxEndpoints": 1024}
        conf.write_text(json.dumps({"cniVersion": "1.1.0", "name": "n", "plugins": [plugin]}))
        refused = sluicectl("datapath", "load", "--conf", conf)
        assert refused.returncode != 0 and "map sizes" in refused.stderr
    finally:
        shutil.rmtree(old, ignore_errors=True)
