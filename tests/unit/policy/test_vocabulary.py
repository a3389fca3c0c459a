"""The policy vocabulary: every CIDR has a family, and the datapath refuses what it
does not compile by name."""

from __future__ import annotations

import pytest

from cni.datapath.ruleset import compile_direction
from cni.policy.vocabulary import AllowRule, Family, PeerCIDR, PolicyError, Ports


def test_every_cidr_has_its_family() -> None:
    assert PeerCIDR("10.0.0.0/8", ("10.1.0.0/16",)).family == Family.IPV4
    assert PeerCIDR("fd00::/8", ("fd00:1::/32",)).family == Family.IPV6
    assert PeerCIDR("10.0.0.1").family == Family.IPV4


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        (PeerCIDR("10.0.0.0/33"), "invalid CIDR '10.0.0.0/33'"),
        (PeerCIDR("10.0.0.0/8", ("fd00::/8",)), "exception 'fd00::/8' of '10.0.0.0/8'"),
    ],
)
def test_a_cidr_without_one_family_is_a_policy_error(peer: PeerCIDR, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        _ = peer.family


def test_the_datapath_refuses_an_ipv6_peer_by_name() -> None:
    rules = [AllowRule(peers=(PeerCIDR("fd00::/8"),), ports=(Ports("tcp", 80),))]
    with pytest.raises(PolicyError, match="peer 'fd00::/8': the datapath compiles IPv4"):
        compile_direction(rules)
    assert compile_direction([AllowRule(peers=(PeerCIDR("10.0.0.0/8"),))]).size > 0
