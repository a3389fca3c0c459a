"""Deny events as ``sluicectl datapath monitor`` prints them: the pod on each side of
a denied packet (not an ifindex), and a frame that is not IPv4 by its EtherType."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.datapath import policy_install as P
from cni.datapath.events import follow
from cni.datapath.maps import Datapath
from cni.policy.vocabulary import EndpointPolicy
from tests.harness import packets as pk
from tests.harness.cni_run import TEST_BPF_DIR, Network, PodNamespaces, node_veth, sluicectl
from tests.harness.datapath_pods import Pod, allow

NAMESPACE = "events"


@pytest.fixture
def named(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    """A client and a server pod, wired with their Kubernetes names in CNI_ARGS."""
    made: list[Pod] = []
    try:
        for name in ("client", "server"):
            netns = pods.new()
            args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={name}"
            result = network.add(netns, name, cni_args=args)
            veth, ifindex = node_veth(result)
            made.append(Pod(name, netns, result["ips"][0]["address"].split("/")[0], veth, ifindex))
        yield made
    finally:
        for pod in made:
            network.delete(pod.netns, pod.cid)


@pytest.fixture
def conf(network: Network, tmp_path: Path) -> str:
    """The network's conflist, for sluicectl --conf (bpfDir and stateDir from it)."""
    plugin = {k: v for k, v in network.config().items() if k not in ("name", "cniVersion")}
    path = tmp_path / "10-events.conflist"
    path.write_text(
        json.dumps({"cniVersion": network.cni_version, "name": network.name, "plugins": [plugin]})
    )
    return str(path)


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def provoke(dp: Datapath, client: Pod, server: Pod, port: int) -> None:
    """A datagram the server's policy denies and an IPv6 frame from the client, after
    the events queued so far are read (the monitor's --backlog then starts here)."""
    for _ in follow(dp.path("events"), timeout=0.1):
        pass
    assert client.probe("udp", server.ip, port, "--count", 1) == 0
    ipv6 = pk.ipv6_udp("fe80::1", "ff02::1", 5353, 5353)
    assert client.probe("frame", ipv6.hex()) == 0


def monitor(conf: str, *output: str) -> str:
    run = sluicectl("datapath", "monitor", "--conf", conf, "--backlog", "--timeout", "1", *output)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_monitor_names_the_pods_and_a_frame_by_its_ethertype(
    named: list[Pod], conf: str, dp: Datapath
) -> None:
    client, server = named
    P.install(dp, server.ifindex, EndpointPolicy(ingress=allow()))

    provoke(dp, client, server, 6300)
    lines = monitor(conf).splitlines()
    denied = [line for line in lines if "denied-policy" in line]
    assert denied, lines
    fields = denied[0].split()
    assert fields[1:4] == ["denied-policy", "ingress", "udp"]
    assert fields[4] == f"{NAMESPACE}/client" and fields[5].startswith(f"{client.ip}:")
    assert fields[6:] == ["->", f"{NAMESPACE}/server", f"{server.ip}:6300"]
    frame = f"drop-unsupported egress  IPv6 (0x86dd) frame from {NAMESPACE}/client"
    assert any(line.endswith(frame) for line in lines), lines
    assert "ifindex" not in " ".join(lines) and "0.0.0.0:0" not in " ".join(lines)

    provoke(dp, client, server, 6301)
    output = monitor(conf, "-o", "json")
    events: list[dict[str, Any]] = [json.loads(line) for line in output.splitlines()]
    udp = next(e for e in events if e["reason"] == "denied-policy")
    assert (udp["source"], udp["destination"], udp["dport"]) == (client.ip, server.ip, 6301)
    pods = (udp["sourcePod"], udp["destinationPod"])
    assert pods == (f"{NAMESPACE}/client", f"{NAMESPACE}/server")
    assert udp["pod"] == f"{NAMESPACE}/server" and udp["ifindex"] == server.ifindex
    assert udp["ethertype"] == "0x0800"
    ipv6 = next(e for e in events if e["ethertype"] == "0x86dd" and e["ifindex"] == client.ifindex)
    assert (ipv6["reason"], ipv6["direction"]) == ("drop-unsupported", "egress")
    assert ipv6["pod"] == f"{NAMESPACE}/client" and "sourcePod" not in ipv6


def test_without_names_the_endpoint_is_its_ifindex(
    named: list[Pod], conf: str, dp: Datapath
) -> None:
    """--bpf-dir alone (no config names the stateDir): the addresses and the ifindex."""
    client, server = named
    P.install(dp, server.ifindex, EndpointPolicy(ingress=allow()))
    provoke(dp, client, server, 6302)
    run = sluicectl("datapath", "monitor", "--bpf-dir", TEST_BPF_DIR, "--backlog", "--timeout", "1")
    lines = run.stdout.splitlines()
    source, arrow, destination = next(ln for ln in lines if "denied-policy" in ln).split()[4:]
    assert source.startswith(f"{client.ip}:") and (arrow, destination) == (
        "->",
        f"{server.ip}:6302",
    )
    frame = f"IPv6 (0x86dd) frame from ifindex {client.ifindex}"
    assert any(line.endswith(frame) for line in lines), lines
