"""The plugin's wiring (cni/plugin/podnet.py) against a recording EndpointRegistry:
real veths in real namespaces, no datapath. What the wiring asks of the datapath,
in which order, and whether the veth existed (or was up) when it asked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from cni.net import link
from cni.net.netlink import Rtnl, node_socket, pod_socket
from cni.net.netns import open_pod_netns
from cni.plugin import podnet
from cni.spec.errors import CNIError
from tests.harness.cni_run import PodNamespaces
from tests.harness.fake_endpoints import RecordingEndpoints

ADDRESSING = podnet.Addressing(["198.18.77.5/24"], podnet.pod_routes([]))


@dataclass
class Wiring:
    node: Rtnl
    pod: Rtnl
    netns_fd: int
    plan: podnet.VethPlan

    @property
    def name(self) -> str:
        return self.plan.pair.node_veth

    def node_link(self) -> link.Link | None:
        return link.get_link(self.node, self.name)

    def pair(self, registry: RecordingEndpoints) -> podnet.MadePair:
        """The pair made and its endpoint registered, as ADD does before bring_up."""
        made = podnet.create_pair(self.node, self.pod, self.netns_fd, self.plan, registry)
        podnet.register(registry, made, ADDRESSING)
        return made


@pytest.fixture
def wiring(pods: PodNamespaces) -> Iterator[Wiring]:
    name = f"slt{uuid.uuid4().hex[:8]}"
    plan = podnet.VethPlan(podnet.VethPair(name, f"sluice/test/{name}", "eth0"), 1500, None, True)
    with ExitStack() as opened:
        netns = opened.enter_context(open_pod_netns(pods.new()))
        node = opened.enter_context(node_socket())
        made = Wiring(node, opened.enter_context(pod_socket(netns)), netns.fd, plan)
        try:
            yield made
        finally:
            if made.node_link() is not None:
                link.delete_link(node, name)


def test_the_endpoint_is_registered_before_the_pair_is_up_and_detached_after_it_is_gone(
    wiring: Wiring,
) -> None:
    registry = RecordingEndpoints()
    made = wiring.pair(registry)
    podnet.bring_up(wiring.node, wiring.pod, made, ADDRESSING)
    node_link, pod_link = wiring.node_link(), link.get_link(wiring.pod, "eth0")
    assert node_link is not None and node_link.up and pod_link is not None and pod_link.up
    # The attach runs in a thread of its own, beside the registration: both before up.
    assert sorted(registry.methods()) == ["attach", "register"]
    assert all(call.veth_existed for call in registry.calls)
    assert registry.registered == {made.ifindex: ("198.18.77.5",)}

    podnet.remove_pair(wiring.node, made, registry, ADDRESSING.ips)
    assert registry.methods()[-1] == "detach"
    detach = registry.calls[-1]
    assert detach.ifindex == made.ifindex and not detach.veth_existed, "detached before deletion"
    assert wiring.node_link() is None and registry.registered == {}


def test_a_refused_attach_fails_before_either_end_is_up_and_leaves_nothing(
    wiring: Wiring,
) -> None:
    registry = RecordingEndpoints()
    registry.fail_next("attach", "the kernel refused the program")
    made = wiring.pair(registry)
    with pytest.raises(CNIError, match="the kernel refused the program"):
        podnet.bring_up(wiring.node, wiring.pod, made, ADDRESSING)
    node_link = wiring.node_link()
    pod_link = link.get_link(wiring.pod, "eth0")
    assert node_link is not None and pod_link is not None
    assert not node_link.up and not pod_link.up, "a pair without its programs came up"

    podnet.remove_pair(wiring.node, made, registry, ADDRESSING.ips)
    assert wiring.node_link() is None and registry.registered == {}


def test_a_cut_off_pair_is_forgotten_while_down_and_its_links_released_once_deleted(
    wiring: Wiring,
) -> None:
    registry = RecordingEndpoints()
    made = wiring.pair(registry)
    podnet.bring_up(wiring.node, wiring.pod, made, ADDRESSING)
    veth = wiring.node_link()
    assert veth is not None

    delete_veth = podnet.cut_off(wiring.node, veth, registry, ADDRESSING.ips)
    forget = registry.calls[-1]
    assert forget.method == "forget" and forget.veth_existed
    down = wiring.node_link()
    assert down is not None and not down.up, "forgotten while the pair could still carry"
    assert registry.registered == {}

    delete_veth()
    release = registry.calls[-1]
    assert release.method == "release_links" and not release.veth_existed
    assert wiring.node_link() is None
