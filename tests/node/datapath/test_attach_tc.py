"""The datapath's "attach": "tc": clsact filters on each pod's veth instead of tcx
links, with real packets: the same verdicts, a reload that swaps the filters'
programs without cutting established flows, CHECK, and nothing left after DEL.
(On kernels without tcx the plugin takes this path on its own.)"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.datapath import loader
from cni.datapath import policy_install as P
from cni.datapath.attach import HOOKS, link_path
from cni.datapath.endpoint_check import attached_programs, pinned_programs
from cni.datapath.maps import Datapath
from cni.net.netlink import node_socket
from cni.policy.vocabulary import EndpointPolicy
from tests.harness.cni_run import (
    SLUICECTL,
    TEST_BPF_DIR,
    Invocation,
    Network,
    PodNamespaces,
    node_veth,
)
from tests.harness.datapath_pods import HeldConnection, Pod, Server, allow, rule, tcp, wired_pods

TC = {"attach": "tc"}


@pytest.fixture
def pair(network: Network, pods: PodNamespaces) -> Iterator[list[Pod]]:
    """Two pods whose programs are clsact filters."""
    with wired_pods(network, pods, "ab", network.config(datapath=TC)) as made:
        yield made


@pytest.fixture
def dp() -> Iterator[Datapath]:
    with Datapath(TEST_BPF_DIR) as datapath:
        yield datapath


def qdiscs(veth: str) -> list[str]:
    out = subprocess.run(
        ["tc", "-j", "qdisc", "show", "dev", veth], capture_output=True, text=True, check=True
    ).stdout
    return [q["kind"] for q in json.loads(out)]


def attached(ifindex: int) -> dict[str, int | None]:
    with node_socket() as node, Datapath(TEST_BPF_DIR) as datapath:
        return attached_programs(datapath, node, ifindex)


def filter_programs(veth: str) -> dict[str, int]:
    """{program: id} of the veth's bpf filters, as tc reports them."""
    found = {}
    for direction, program in (("ingress", "from_pod"), ("egress", "to_pod")):
        out = subprocess.run(
            ["tc", "-j", "filter", "show", "dev", veth, direction],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for entry in json.loads(out):
            options = entry.get("options") or {}
            if options.get("bpf_name") == f"sluice_{program}":
                found[program] = options["prog"]["id"]
    return found


def test_filters_judge_like_links_and_a_reload_swaps_them(pair: list[Pod], dp: Datapath) -> None:
    a, b = pair
    assert "clsact" in qdiscs(b.veth)
    assert not any(Path(link_path(TEST_BPF_DIR, b.ifindex, p)).exists() for p in HOOKS)
    pinned = pinned_programs(dp)
    assert attached(b.ifindex) == {p: pinned[p] for p in HOOKS}
    assert filter_programs(b.veth) == attached(b.ifindex)  # as tc itself sees them
    P.install(dp, b.ifindex, EndpointPolicy(ingress=allow(rule(f"{a.ip}/32", ports=(tcp(8080),)))))
    with Server(b, tcp=(8080, 8081)):
        assert a.connects(b, 8080) and not a.connects(b, 8081)
        held = HeldConnection(a, b, 8080)
        assert loader.load(TEST_BPF_DIR, force=True)
        assert held.finish() == "echo", "the established flow survived the reload"
        new = pinned_programs(dp)
        assert set(new.values()).isdisjoint(pinned.values())
        assert attached(b.ifindex) == {p: new[p] for p in HOOKS}, "the filters were swapped"
        assert filter_programs(b.veth) == attached(b.ifindex)
        assert a.connects(b, 8080) and not a.connects(b, 8081)


def test_check_notices_a_missing_filter_and_del_leaves_nothing(
    network: Network, pods: PodNamespaces, dp: Datapath
) -> None:
    config = network.config(datapath=TC)
    netns = pods.new()
    result = network.add(netns, "c1", config=config)
    veth, ifindex = node_veth(result)
    check = network.config(result["cniVersion"], prevResult=result, datapath=TC)

    def checked() -> Invocation:
        return network.run("CHECK", check, container_id="c1", netns=netns, ifname="eth0")

    checked().ok()
    subprocess.run(["tc", "filter", "del", "dev", veth, "egress"], check=True)
    run = checked()
    assert run.error_code == 101 and "to_pod" in run.out["details"], run.out
    network.delete(netns, "c1", config=config).ok()
    assert network.veths() == [] and network.allocations() == {}
    assert dp.endpoints.get(ifindex) is None
    assert not any(Path(link_path(TEST_BPF_DIR, ifindex, p)).exists() for p in HOOKS)


def test_bandwidth_cannot_be_chained_with_tc(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            *(SLUICECTL, "install", "--bin-dir", tmp_path / "bin", "--conf-dir"),
            *(tmp_path / "conf", "--attach", "tc", "--chain", "bandwidth"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and "bandwidth" in run.stderr
