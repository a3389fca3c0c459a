"""The policy vocabulary: every CIDR has a family, tiers keep their order, and the
datapath refuses what it does not compile by name."""

from __future__ import annotations

from typing import cast

import pytest

from cni.datapath.maps import Datapath
from cni.datapath.policy_install import install_many
from cni.datapath.ruleset import compile_direction
from cni.policy.vocabulary import (
    Action,
    AllowRule,
    EndpointPolicy,
    Family,
    PeerCIDR,
    PolicyError,
    Ports,
    Tier,
    TierRule,
)


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


def test_tiers_are_ordered_before_then_after() -> None:
    admin = Tier("admin", ingress=(TierRule(Action.DENY, peers=(PeerCIDR("10.9.0.0/16"),)),))
    passing = Tier("platform", egress=(TierRule(Action.PASS),))
    baseline = Tier("baseline", ingress=(TierRule(Action.ACCEPT, ports=(Ports("tcp", 53),)),))
    policy = EndpointPolicy(ingress=(), before=(admin, passing), after=(baseline,))
    assert [tier.name for tier in policy.tiers] == ["admin", "platform", "baseline"]
    assert EndpointPolicy().tiers == ()
    assert {action.value for action in Action} == {"Accept", "Deny", "Pass"}


@pytest.mark.parametrize("place", ["before", "after"])
def test_the_datapath_refuses_a_policy_with_tiers_by_name_before_any_write(place: str) -> None:
    tier = Tier("security", ingress=(TierRule(Action.DENY),))
    policy = EndpointPolicy(ingress=(AllowRule(),), **{place: (tier,)})  # type: ignore[arg-type]
    # Refused before the datapath is touched: no map is read or written.
    untouched = cast(Datapath, object())
    with pytest.raises(PolicyError, match="tiers 'security': the datapath compiles no"):
        install_many(untouched, {7: policy})
    # With ``failed``, the endpoint is reported and the rest of the batch installed:
    # tests/node/datapath/test_datapath.py, on the kernel's maps.
