"""Verdicts of the datapath programs with BPF_PROG_TEST_RUN: a packet in, a verdict
and counters out. No pods, no sleeps.

The endpoints are keyed by the ifindexes of a veth pair that only anchors
them (test runs set ``skb->ifindex`` through the context, and the kernel
wants a device of that index); "a" and "b" stand for two pods on the node.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cni.datapath import bpf, bpf_programs, loader
from cni.datapath import policy_install as P
from cni.datapath.maps import Datapath
from cni.datapath.structs import (
    CT_POST_DNAT,
    CT_SERVICE,
    CT_SHARES,
    CTEntry,
    CTKey,
    Endpoint,
    ip_be,
)
from cni.policy.vocabulary import AllowRule, EndpointPolicy, PeerCIDR, Ports
from tests.harness import packets as pk
from tests.harness.cni_run import SESSION_TAG, TEST_BPF_DIR

PASS, DROP = -1, 2
A_IP, A_IP2, B_IP, C_IP = "10.77.0.2", "10.77.0.3", "10.77.0.4", "10.77.0.5"
PEER, NODE, CLUSTER_IP, REMOTE = "10.88.0.9", "172.31.0.1", "10.96.0.10", "10.99.0.7"


@dataclass
class Bench:
    dp: Datapath
    a: int
    b: int
    c: int
    progs: dict[str, int]

    def run(self, program: str, frame: bytes, ifindex: int, ingress_ifindex: int = 0) -> int:
        ctx = bpf_programs.SkBuff(ifindex=ifindex, ingress_ifindex=ingress_ifindex)
        return bpf_programs.test_run(self.progs[program], frame, ctx)[0]

    def out_of(self, ifindex: int, frame: bytes) -> int:
        """The pod behind ``ifindex`` sends ``frame`` (from-pod)."""
        return self.run("from_pod", frame, ifindex)

    def into(self, ifindex: int, frame: bytes, ingress_ifindex: int = 9999) -> int:
        """``frame`` is forwarded to the pod behind ``ifindex`` (to-pod); by default
        from some other interface (not the node itself: ingress_ifindex 0)."""
        return self.run("to_pod", frame, ifindex, ingress_ifindex)

    def counted(self, direction: str, reason: str) -> int:
        return self.dp.counters()[direction][reason]

    def policy(self, ifindex: int, **directions: object) -> None:
        P.install(self.dp, ifindex, EndpointPolicy(**directions))  # type: ignore[arg-type]


def veth_pair(name: str) -> tuple[int, int]:
    subprocess.run(
        ["ip", "link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b"], check=True
    )
    return socket.if_nametoindex(f"{name}a"), socket.if_nametoindex(f"{name}b")


@pytest.fixture
def bench() -> Iterator[Bench]:
    loader.ensure_loaded(TEST_BPF_DIR)
    names = [f"slt{SESSION_TAG}v{i}" for i in range(2)]
    made = []
    progs: dict[str, int] = {}
    try:
        ifindexes = []
        for name in names:
            ifindexes += veth_pair(name)
            made.append(f"{name}a")
        with Datapath(TEST_BPF_DIR) as dp:
            dp.set_config(after_nat=1)  # as if on netfilter's hooks: service flows deferred
            for ifindex, ips in zip(ifindexes, ([A_IP, A_IP2], [B_IP], [C_IP]), strict=False):
                dp.endpoints.put(ifindex, Endpoint(ip=ip_be(ips[0])))
                dp.endpoints.add_ips(ifindex, ips)
                dp.conntrack.create_table(ifindex, 64)
            for name in ("from_pod", "to_pod", "uplink"):
                progs[name] = bpf.obj_get(os.path.join(TEST_BPF_DIR, name))
            try:
                yield Bench(dp, *ifindexes[:3], progs)
            finally:
                for ifindex in ifindexes:
                    dp.endpoints.delete(ifindex)
                dp.network.set_service_ips([])
    finally:
        for fd in progs.values():
            os.close(fd)
        for name in made:
            subprocess.run(["ip", "link", "del", name], check=False)


def rule(cidr: str, *ports: Ports) -> AllowRule:
    return AllowRule(peers=(PeerCIDR(cidr),), ports=ports)


def a_to_peer(proto_payload: bytes, proto: int, src: str = A_IP, dst: str = PEER) -> bytes:
    return pk.eth(pk.ipv4(src, dst, proto, proto_payload))


# -- what may leave a pod ---------------------------------------------------------------


def test_only_untagged_ipv4_and_arp_leave_a_pod_in_every_mode(bench: Bench) -> None:
    """No policy at all ("policy": "off"): still no VLAN tag, no IPv6, no spoofed ARP."""
    udp = pk.ipv4(A_IP, B_IP, 17, pk.udp(4000, 53))
    before = bench.counted("egress", "drop-unsupported")
    assert bench.out_of(bench.a, pk.eth(udp)) == PASS
    assert bench.out_of(bench.a, pk.vlan(udp, pk.ETH_IP, 0)) == DROP
    assert bench.out_of(bench.a, pk.vlan(udp, pk.ETH_IP, 0, 0)) == DROP, "double-tagged VLAN 0"
    assert bench.out_of(bench.a, pk.ipv6_udp("fe80::1", "fe80::2", 1, 2)) == DROP
    assert bench.out_of(bench.a, pk.eth(b"\0" * 46, 0x88B5)) == DROP, "another ethertype"
    assert bench.counted("egress", "drop-unsupported") - before == 4
    assert bench.into(bench.a, pk.ipv6_udp("fe80::1", "fe80::2", 1, 2)) == PASS, "not isolated"


def test_arp_only_with_one_of_the_pods_addresses(bench: Bench) -> None:
    assert bench.out_of(bench.a, pk.arp(A_IP, B_IP)) == PASS
    assert bench.out_of(bench.a, pk.arp(A_IP2, B_IP)) == PASS, "its second address"
    assert bench.out_of(bench.a, pk.arp("0.0.0.0", B_IP)) == PASS, "an ARP probe"
    assert bench.out_of(bench.a, pk.arp(B_IP, PEER)) == DROP, "b's address"


def test_every_address_of_a_pod_is_its_own(bench: Bench) -> None:
    for source, verdict in ((A_IP, PASS), (A_IP2, PASS), (B_IP, DROP), ("10.77.0.99", DROP)):
        frame = pk.eth(pk.ipv4(source, PEER, 17, pk.udp(4000, 53)))
        assert bench.out_of(bench.a, frame) == verdict, source


def test_malformed_and_truncated_headers(bench: Bench) -> None:
    packet = pk.ipv4(A_IP, PEER, 17, pk.udp(1, 2))
    short = pk.eth(bytes([0x4F]) + packet[1:])  # a 60-byte header in a 28-byte packet
    assert bench.out_of(bench.a, short) == DROP, "truncated IPv4 header from a pod"
    assert bench.out_of(bench.a, pk.eth(bytes([0x55]) + packet[1:])) == DROP, "IP version 5"
    assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, PEER, 6, b"\0" * 6))) == DROP, "short TCP"
    lying = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(1, 2), tot_len=1400))
    assert bench.out_of(bench.a, lying) == DROP, "tot_len beyond the packet"
    assert bench.into(bench.a, short) == PASS, "to a pod whose ingress is not isolated"
    bench.policy(bench.a, ingress=())
    assert bench.into(bench.a, short) == DROP


def test_ip_options_do_not_hide_the_ports(bench: Bench) -> None:
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 53)),))
    options = b"\x94\x04\x00\x00"
    for port, verdict in ((53, PASS), (54, DROP)):
        frame = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(4000 + port, port), options=options))
        assert bench.out_of(bench.a, frame) == verdict


# -- fragments -----------------------------------------------------------------------------


def test_fragments_follow_their_first_fragment_age_and_are_rechecked(bench: Bench) -> None:
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 53)),))
    first = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(4000, 53, b"x" * 32), ident=7, frag=0x2000))
    later = pk.eth(pk.ipv4(A_IP, PEER, 17, b"y" * 32, ident=7, frag=5))
    stray = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(4000, 53), ident=8, frag=5))
    assert bench.out_of(bench.a, first) == PASS
    assert bench.out_of(bench.a, later) == PASS
    assert bench.out_of(bench.a, stray) == DROP, "a later fragment never passes on its own"
    # A new policy that denies the flow: the next fragment is judged again.
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 54)),))
    assert bench.out_of(bench.a, later) == DROP
    # Fragment entries age.
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 53)),))
    assert bench.out_of(bench.a, first) == PASS
    age_entries(bench.dp, bench.a)
    assert bench.out_of(bench.a, later) == DROP


def age_entries(dp: Datapath, ifindex: int) -> None:
    """Make every entry of the endpoint's tables look a day old."""
    for inbound in CT_SHARES:
        fd = dp.conntrack.open_table(ifindex, inbound)
        assert fd is not None
        try:
            for key, value in dp.conntrack.flows(ifindex, inbound):
                value.last_seen = max(0, value.last_seen - 86400 * 10**9)
                bpf.map_update(fd, key, value)
        finally:
            os.close(fd)


# -- ICMP errors ---------------------------------------------------------------------------


def open_tcp_flow(bench: Bench, port: int = 443) -> bytes:
    """a opens a TCP flow to PEER (a's egress allows it); return a's SYN as IPv4."""
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("tcp", port)),), ingress=())
    syn = pk.ipv4(A_IP, PEER, 6, pk.tcp(40000, port, pk.TCP_SYN))
    assert bench.out_of(bench.a, pk.eth(syn)) == PASS
    return syn


def test_icmp_errors_quoting_eight_bytes_are_related(bench: Bench) -> None:
    """RFC 792 quotes only 8 bytes of the transport header: PMTU must still work."""
    syn = open_tcp_flow(bench)
    before = bench.counted("ingress", "allowed-related")
    for quote in (8, 20):
        error = pk.eth(pk.ipv4("10.0.0.254", A_IP, 1, pk.icmp_error(syn, quote, 3, 4)))
        assert bench.into(bench.a, error) == PASS, f"a quote of {quote} bytes"
    assert bench.counted("ingress", "allowed-related") - before == 2


def test_forged_icmp_errors_are_dropped(bench: Bench) -> None:
    syn = open_tcp_flow(bench)
    other = pk.ipv4(PEER, A_IP, 6, pk.tcp(443, 40000, pk.TCP_SYN))
    cases = {
        "outer destination is not the quoted source": pk.ipv4(PEER, B_IP, 1, pk.icmp_error(syn)),
        "quotes a flow the other way": pk.ipv4(PEER, PEER, 1, pk.icmp_error(other)),
        "longer than any router sends": pk.ipv4(PEER, A_IP, 1, pk.icmp_error(syn, 8) + b"z" * 600),
        "quotes a flow nobody tracks": pk.ipv4(
            PEER, A_IP, 1, pk.icmp_error(pk.ipv4(A_IP, PEER, 6, pk.tcp(40001, 443)))
        ),
    }
    before = bench.counted("ingress", "drop-icmp-error")
    for what, packet in cases.items():
        assert bench.into(bench.a, pk.eth(packet)) == DROP, what
    assert bench.counted("ingress", "drop-icmp-error") - before == len(cases)


def test_icmp_errors_follow_the_policy_generation(bench: Bench) -> None:
    syn = open_tcp_flow(bench)
    error = pk.eth(pk.ipv4(PEER, A_IP, 1, pk.icmp_error(syn)))
    assert bench.into(bench.a, error) == PASS
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("tcp", 80)),), ingress=())
    assert bench.into(bench.a, error) == DROP, "the flow is cut, its errors with it"


def test_an_error_the_pod_sends_names_a_flow_to_it(bench: Bench) -> None:
    bench.policy(bench.a, ingress=(rule(f"{PEER}/32", Ports("udp", 53)),), egress=())
    query = pk.ipv4(PEER, A_IP, 17, pk.udp(5000, 53))
    assert bench.into(bench.a, pk.eth(query)) == PASS
    unreachable = pk.eth(pk.ipv4(A_IP, PEER, 1, pk.icmp_error(query)))
    assert bench.out_of(bench.a, unreachable) == PASS
    forged = pk.eth(pk.ipv4(A_IP, "10.1.2.3", 1, pk.icmp_error(query)))
    assert bench.out_of(bench.a, forged) == DROP


# -- conntrack direction and state -----------------------------------------------------------


def test_a_mid_stream_packet_never_opens_the_other_direction(bench: Bench) -> None:
    """a's egress allows nothing; its ingress is open. An ACK from a peer (a lost entry,
    or a forgery) passes a's ingress but must not make a's packets to it replies."""
    bench.policy(bench.a, egress=())
    ack = pk.eth(pk.ipv4(PEER, A_IP, 6, pk.tcp(443, 40000, pk.TCP_ACK)))
    assert bench.into(bench.a, ack) == PASS
    assert bench.dp.conntrack.flows(bench.a) == [], "no entry from a packet without SYN"
    back = pk.eth(pk.ipv4(A_IP, PEER, 6, pk.tcp(40000, 443, pk.TCP_ACK)))
    assert bench.out_of(bench.a, back) == DROP


def test_a_syn_is_never_a_reply(bench: Bench) -> None:
    """PEER opened a flow to a; a pure SYN of a on the reversed tuple is a new flow of
    a's egress (denied), not a reply."""
    bench.policy(bench.a, egress=())
    assert bench.into(bench.a, pk.eth(pk.ipv4(PEER, A_IP, 6, pk.tcp(443, 40000)))) == PASS
    synack = pk.eth(pk.ipv4(A_IP, PEER, 6, pk.tcp(40000, 443, pk.TCP_SYN | pk.TCP_ACK)))
    assert bench.out_of(bench.a, synack) == PASS, "the reply"
    assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, PEER, 6, pk.tcp(40000, 443)))) == DROP


def test_a_syn_on_a_closed_flow_starts_a_fresh_entry(bench: Bench) -> None:
    syn = open_tcp_flow(bench)
    rst = pk.eth(pk.ipv4(PEER, A_IP, 6, pk.tcp(443, 40000, pk.TCP_RST | pk.TCP_ACK)))
    assert bench.into(bench.a, rst) == PASS
    ((_, entry),) = bench.dp.conntrack.flows(bench.a)
    assert entry.flags & 0x8, "closed by RST"
    # The same 5-tuple again: a fresh entry, judged by the (now narrower) policy.
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("tcp", 80)),), ingress=())
    assert bench.out_of(bench.a, pk.eth(syn)) == DROP
    assert bench.dp.conntrack.flows(bench.a) == []


def test_echo_flows_match_only_replies_to_the_pods_own_request(bench: Bench) -> None:
    bench.policy(bench.a, ingress=())  # isolated: nothing may reach a but replies
    assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, PEER, 1, pk.echo(True, 77)))) == PASS
    request = pk.eth(pk.ipv4(PEER, A_IP, 1, pk.echo(True, 77)))
    assert bench.into(bench.a, request) == DROP, "a request carrying a's identifier"
    assert bench.into(bench.a, pk.eth(pk.ipv4(PEER, A_IP, 1, pk.echo(False, 77)))) == PASS
    assert bench.into(bench.a, pk.eth(pk.ipv4(PEER, A_IP, 1, pk.echo(False, 78)))) == DROP


def test_a_new_generation_cuts_a_flow_it_denies(bench: Bench) -> None:
    syn = open_tcp_flow(bench)
    data = pk.eth(pk.ipv4(A_IP, PEER, 6, pk.tcp(40000, 443, pk.TCP_ACK, b"data")))
    assert bench.out_of(bench.a, data) == PASS
    before = bench.counted("egress", "drop-flow-cut")
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("tcp", 80)),), ingress=())
    assert bench.out_of(bench.a, data) == DROP
    assert bench.counted("egress", "drop-flow-cut") - before == 1
    assert syn


def test_port_zero_to_n_is_a_range_not_any_port(bench: Bench) -> None:
    bench.policy(bench.a, egress=(rule(f"{PEER}/32", Ports("udp", 0, 100)),))
    for port, verdict in ((53, PASS), (100, PASS), (101, DROP), (8080, DROP)):
        frame = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(5000 + port, port)))
        assert bench.out_of(bench.a, frame) == verdict, port


def test_one_pod_cannot_evict_another_pods_flows(bench: Bench) -> None:
    """Tables of 64 entries each: a opens 500 flows; b's flow survives."""
    bench.policy(bench.b, egress=(rule(f"{PEER}/32", Ports("udp", 53)),))
    b_flow = pk.eth(pk.ipv4(B_IP, PEER, 17, pk.udp(6000, 53)))
    assert bench.out_of(bench.b, b_flow) == PASS
    for sport in range(1000, 1500):
        assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(sport, 53)))) == PASS
    assert len(bench.dp.conntrack.flows(bench.b)) == 1
    fill = bench.dp.conntrack.fill(bench.a)
    assert fill is not None and fill.capacity == 2 * 64 and fill.created == 500
    assert fill.entries <= 64 and fill.evicted == 500 - fill.entries
    reply = pk.eth(pk.ipv4(PEER, B_IP, 17, pk.udp(53, 6000)))
    bench.policy(bench.b, egress=(rule(f"{PEER}/32", Ports("udp", 53)),), ingress=())
    assert bench.into(bench.b, reply) == PASS, "b's reply still finds its entry"


def test_inbound_flows_never_evict_the_flows_a_pod_opened(bench: Bench) -> None:
    """Tables of 64 entries each: PEER (allowed in) opens 500 flows to b; the answer
    to b's own query still finds its entry, and the mirror: b opening 500 flows keeps
    the one PEER opened to it."""
    bench.policy(
        bench.b,
        egress=(rule(f"{PEER}/32", Ports("udp", 53)), rule(f"{C_IP}/32")),
        ingress=(rule(f"{PEER}/32", Ports("udp", 9000)),),
    )
    query = pk.eth(pk.ipv4(B_IP, PEER, 17, pk.udp(6000, 53)))
    assert bench.out_of(bench.b, query) == PASS
    for sport in range(1000, 1500):
        assert bench.into(bench.b, pk.eth(pk.ipv4(PEER, B_IP, 17, pk.udp(sport, 9000)))) == PASS
    assert len(bench.dp.conntrack.flows(bench.b, inbound=False)) == 1
    assert len(bench.dp.conntrack.flows(bench.b, inbound=True)) <= 64
    assert bench.into(bench.b, pk.eth(pk.ipv4(PEER, B_IP, 17, pk.udp(53, 6000)))) == PASS
    # The mirror: PEER's flow into b, then b floods C; b's answer to PEER still passes.
    ask = pk.eth(pk.ipv4(PEER, B_IP, 17, pk.udp(7000, 9000)))
    assert bench.into(bench.b, ask) == PASS
    for sport in range(1000, 1500):
        assert bench.out_of(bench.b, pk.eth(pk.ipv4(B_IP, C_IP, 17, pk.udp(sport, 80)))) == PASS
    assert bench.out_of(bench.b, pk.eth(pk.ipv4(B_IP, PEER, 17, pk.udp(9000, 7000)))) == PASS


def test_no_endpoint_or_no_table_fails_closed(bench: Bench) -> None:
    frame = pk.eth(pk.ipv4(A_IP, PEER, 17, pk.udp(4000, 53)))
    slot = bench.dp.endpoints.get(bench.a).ct_slot  # type: ignore[union-attr]
    bpf.map_delete(bench.dp.fd("ct_tables"), ctypes.c_uint32(slot))
    assert bench.out_of(bench.a, frame) == DROP
    bench.dp.endpoints.delete(bench.a)
    assert bench.out_of(bench.a, frame) == DROP


# -- Services: judged after DNAT -------------------------------------------------------------


def service_setup(bench: Bench) -> None:
    """a may reach only b:8080; CLUSTER_IP is a Service."""
    bench.dp.network.set_service_ips([CLUSTER_IP])
    bench.policy(bench.a, egress=(rule(f"{B_IP}/32", Ports("tcp", 8080)),))


def test_a_flow_to_a_cluster_ip_is_judged_on_its_backend(bench: Bench) -> None:
    service_setup(bench)
    to_service = pk.eth(pk.ipv4(A_IP, CLUSTER_IP, 6, pk.tcp(40000, 80)))
    assert bench.out_of(bench.a, to_service) == PASS, "deferred, not judged on the ClusterIP"
    ((key, entry),) = bench.dp.conntrack.flows(bench.a)
    assert entry.flags & CT_SERVICE and key.daddr == ip_be(CLUSTER_IP)
    # After DNAT to b:8080 (allowed) and to c:8080 (denied), on the backends' veths.
    to_b = pk.eth(pk.ipv4(A_IP, B_IP, 6, pk.tcp(40000, 8080)))
    to_c = pk.eth(pk.ipv4(A_IP, C_IP, 6, pk.tcp(40001, 8080)))
    before = bench.counted("egress", "denied-policy")
    assert bench.into(bench.b, to_b) == PASS
    assert bench.into(bench.c, to_c) == DROP
    assert bench.counted("egress", "denied-policy") - before == 1, "counted as a's egress"
    post = [e for _, e in bench.dp.conntrack.flows(bench.a) if e.flags & CT_POST_DNAT]
    assert len(post) == 1
    # The reply, reverse-NATed by netfilter, matches the deferred entry.
    reply = pk.eth(pk.ipv4(CLUSTER_IP, A_IP, 6, pk.tcp(80, 40000, pk.TCP_SYN | pk.TCP_ACK)))
    bench.policy(bench.a, egress=(rule(f"{B_IP}/32", Ports("tcp", 8080)),), ingress=())
    assert bench.into(bench.a, reply) == PASS
    # A tightened policy cuts the service flow on its next packet after DNAT.
    data = pk.eth(pk.ipv4(A_IP, B_IP, 6, pk.tcp(40000, 8080, pk.TCP_ACK, b"more")))
    assert bench.into(bench.b, data) == PASS
    bench.policy(bench.a, egress=(rule(f"{B_IP}/32", Ports("tcp", 9090)),), ingress=())
    assert bench.into(bench.b, data) == DROP


def test_a_flow_to_a_cluster_ip_is_refused_while_nothing_judges_it_after_dnat(
    bench: Bench,
) -> None:
    service_setup(bench)
    to_service = pk.eth(pk.ipv4(A_IP, CLUSTER_IP, 6, pk.tcp(40000, 80)))
    bench.dp.set_config(after_nat=0)
    try:
        assert bench.out_of(bench.a, to_service) == DROP
        assert bench.counted("egress", "drop-unjudged") >= 1
        bench.policy(bench.a)  # not isolated: nothing to judge
        assert bench.out_of(bench.a, to_service) == PASS
    finally:
        bench.dp.set_config(after_nat=1)


def test_direct_flows_are_not_judged_twice(bench: Bench) -> None:
    service_setup(bench)
    syn = pk.eth(pk.ipv4(A_IP, B_IP, 6, pk.tcp(40002, 8080)))
    assert bench.out_of(bench.a, syn) == PASS
    before = bench.dp.conntrack.fill(bench.a)
    assert bench.into(bench.b, syn) == PASS
    after = bench.dp.conntrack.fill(bench.a)
    assert before and after and after.created == before.created


def test_hairpin_a_pod_reaching_itself_through_its_service(bench: Bench) -> None:
    """kube-proxy masquerades hairpin traffic to a node address; it comes back on the
    pod's own veth."""
    service_setup(bench)
    bench.policy(bench.a, egress=(rule(f"{B_IP}/32", Ports("tcp", 8080)),), ingress=())
    assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, CLUSTER_IP, 6, pk.tcp(40003, 80)))) == PASS
    back = pk.eth(pk.ipv4(NODE, A_IP, 6, pk.tcp(61000, 8080)))
    assert bench.into(bench.a, back, ingress_ifindex=bench.a) == PASS
    elsewhere = pk.eth(pk.ipv4(NODE, A_IP, 6, pk.tcp(61001, 8080)))
    assert bench.into(bench.a, elsewhere, ingress_ifindex=bench.b) == DROP, "from elsewhere"


def test_the_uplink_judges_service_flows_to_remote_backends(bench: Bench) -> None:
    service_setup(bench)
    assert bench.out_of(bench.a, pk.eth(pk.ipv4(A_IP, CLUSTER_IP, 6, pk.tcp(40004, 80)))) == PASS
    remote = pk.eth(pk.ipv4(A_IP, REMOTE, 6, pk.tcp(40004, 8080)))
    assert bench.run("uplink", remote, bench.c) == DROP
    bench.policy(bench.a, egress=(rule(f"{REMOTE}/32", Ports("tcp", 8080)),))
    assert bench.run("uplink", remote, bench.c) == PASS
    # The node's own traffic and replies of inbound flows pass.
    assert bench.run("uplink", pk.eth(pk.ipv4(NODE, REMOTE, 6, pk.tcp(1, 2))), bench.c) == PASS
    inbound = pk.eth(pk.ipv4(REMOTE, A_IP, 6, pk.tcp(5555, 8443)))
    assert bench.into(bench.a, inbound) == PASS
    answer = pk.eth(pk.ipv4(A_IP, REMOTE, 6, pk.tcp(8443, 5555, pk.TCP_SYN | pk.TCP_ACK)))
    assert bench.run("uplink", answer, bench.c) == PASS


def test_replacing_the_service_set(bench: Bench) -> None:
    bench.dp.network.set_service_ips([CLUSTER_IP, "10.96.0.11"])
    bench.dp.network.set_service_ips(["10.96.0.11", "10.96.0.12"])
    assert bench.dp.network.service_ips() == {"10.96.0.11", "10.96.0.12"}


def test_ct_key_and_entry_sizes() -> None:
    assert ctypes.sizeof(CTKey) == 16 and ctypes.sizeof(CTEntry) == 24
