"""Hardening of the datapath with real packets from a pod's namespace, counted where
they arrive: what may leave a pod, headers outside the skb's linear part, pods
with several addresses, and the order in which a pod's veth and filter go."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import attach
from cni.datapath.endpoint import DatapathEndpoints
from cni.datapath.maps import Datapath
from cni.net import link
from cni.net.netlink import Rtnl
from cni.plugin import podnet
from tests.harness import packets as pk
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, in_netns, node_veth
from tests.harness.datapath_pods import PROBE, PYTHON, Pod, Server
from tests.harness.fake_endpoints import RecordingEndpoints

NODE_MAC = bytes.fromhex("eeeeeeeeeeee")


@pytest.fixture
def pair(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    made = []
    try:
        for cid in "ab":
            netns = pods.new()
            result = network.add(netns, cid)
            veth, ifindex = node_veth(result)
            made.append(Pod(cid, netns, result["ips"][0]["address"].split("/")[0], veth, ifindex))
        yield made
    finally:
        for pod in made:
            network.delete(pod.netns, pod.cid)


def pod_mac(pod: Pod) -> bytes:
    out = in_netns(pod.netns, "cat", "/sys/class/net/eth0/address", check=True).stdout
    return bytes.fromhex(out.strip().replace(":", ""))


def send_frame(pod: Pod, frame: bytes, vnet: bool = False) -> None:
    extra = ["--vnet"] if vnet else []
    in_netns(pod.netns, PYTHON, PROBE, "frame", frame.hex(), *extra, check=True)


def test_vlan_tagged_frames_never_leave_a_pod(pair: list[Pod]) -> None:
    """Policy "off": a VLAN-0 (priority) tag, once or twice, is taken off by the node
    after the datapath ran and the packet delivered; so tagged frames are dropped."""
    a, b = pair
    mac = pod_mac(a)
    with Server(b, udp=(5900, 5901)) as server:
        own = pk.ipv4(a.ip, b.ip, 17, pk.udp(40000, 5900))
        spoofed = pk.ipv4("10.254.254.254", b.ip, 17, pk.udp(40000, 5901))
        for payload in (own, spoofed):
            for tags in ((0,), (0, 0)):
                frame = NODE_MAC + mac + pk.vlan(payload, pk.ETH_IP, *tags)[12:]
                send_frame(a, frame)
        send_frame(a, pk.eth(own, src=mac, dst=NODE_MAC))  # untagged: arrives
        time.sleep(0.5)
    assert server.counts["udp"] == {"5900": 1, "5901": 0}


def test_the_node_side_veth_takes_no_ipv6_from_the_pod(pair: list[Pod], dp: Datapath) -> None:
    a, _ = pair
    conf = Path(f"/proc/sys/net/ipv6/conf/{a.veth}")
    assert (conf / "disable_ipv6").read_text().strip() == "1"
    assert (conf / "accept_ra").read_text().strip() == "0"
    before = dp.counters()["egress"]["drop-unsupported"]
    frame = pk.ipv6_udp("fe80::1", "ff02::1", 1, 2)
    send_frame(a, NODE_MAC + pod_mac(a) + frame[12:])
    assert dp.counters()["egress"]["drop-unsupported"] - before >= 1


def test_headers_outside_the_linear_part_are_parsed(pair: list[Pod], dp: Datapath) -> None:
    """An 8 KB datagram (more than a page) written through a virtio-net header is built
    with only its Ethernet header linear; the node forwards (and fragments) it to b."""
    a, b = pair
    for netns, dev in ((a.netns, "eth0"), (None, a.veth)):
        command = ["ip", "link", "set", dev, "mtu", "9000"]
        if netns:
            in_netns(netns, *command, check=True)
        else:
            subprocess.run(command, check=True)
    before = dp.counters()["egress"]["drop-malformed"]
    with Server(b, udp=(6200,)) as server:
        datagram = pk.ipv4(a.ip, b.ip, 17, pk.udp(40000, 6200, b"n" * 8000))
        send_frame(a, pk.eth(datagram, src=pod_mac(a), dst=NODE_MAC), vnet=True)
        time.sleep(0.5)
    assert dp.counters()["egress"]["drop-malformed"] == before
    assert server.counts["udp"]["6200"] == 1


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def test_every_address_of_a_pod_is_its_own(
    network: Network, pods: PodNamespaces, tmp_path: Path, dp: Datapath
) -> None:
    """A delegated IPAM (host-local, two ranges) gives the pod two IPv4 addresses: both
    may send, CHECK verifies both are registered."""
    base = network.subnet.rsplit(".", 1)[0]
    ipam = {
        "type": "host-local",
        "dataDir": str(tmp_path / "host-local"),
        "ranges": [[{"subnet": f"{base}.0/25"}], [{"subnet": f"{base}.128/25"}]],
    }
    config = network.config("1.0.0", ipam=ipam, ipMasq=False)
    netns, peer_ns = pods.new(), pods.new()
    try:
        result = network.add(netns, "two", config=config)
        peer_result = network.add(peer_ns, "peer", config=config)
        ips = [ip["address"].split("/")[0] for ip in result["ips"]]
        assert len(ips) == 2
        _, ifindex = node_veth(result)
        veth, peer_ifindex = node_veth(peer_result)
        peer = Pod("peer", peer_ns, peer_result["ips"][0]["address"].split("/")[0], veth, 0)
        two = Pod("two", netns, ips[0], "", ifindex)
        with Server(peer, udp=(6300,)) as server:
            for ip in ips:
                in_netns(netns, PYTHON, PROBE, "send-from", ip, peer.ip, "6300", check=True)
            time.sleep(0.3)
        assert server.counts["udp"]["6300"] == 2
        assert set(dp.endpoints.ips(ifindex)) == set(ips)
        check = network.config(result["cniVersion"], prevResult=result, ipam=ipam, ipMasq=False)
        network.run("CHECK", check, container_id="two", netns=netns, ifname="eth0").ok()
        dp.endpoints.add_ips(peer_ifindex, [ips[1]])  # now registered as another pod's
        run = network.run("CHECK", check, container_id="two", netns=netns, ifname="eth0")
        assert run.error_code == 101 and ips[1] in run.out["details"]
        assert two.ip
    finally:
        network.delete(netns, "two", config=config)
        network.delete(peer_ns, "peer", config=config)


def test_del_deletes_the_veth_before_it_unpins_the_filter(
    network: Network, pods: PodNamespaces
) -> None:
    netns = pods.new()
    result = network.add(netns, "order")
    veth, ifindex = node_veth(result)
    with Rtnl() as node, Datapath(TEST_BPF_DIR) as datapath:
        registry = RecordingEndpoints(passes_to=DatapathEndpoints(datapath))
        podnet.disconnect(node, link.get_link(node, veth), registry)
    assert [(c.method, c.ifindex, c.veth_existed) for c in registry.calls] == [
        ("detach", ifindex, False)
    ], "the veth was gone when its links were unpinned"
    assert not Path(attach.link_path(TEST_BPF_DIR, ifindex, "from_pod")).exists()
    network.delete(netns, "order").ok()
