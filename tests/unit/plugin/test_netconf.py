"""The plugin's configuration: defaults, the parsed IPAM, and errors that name the
key and value."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from cni.plugin.netconf import DelegatedIPAM, parse
from cni.spec.errors import CNIError
from ipam.config import NodeCIDRConfig, PrefixConfig

BASE: dict[str, Any] = {
    "cniVersion": "1.1.0",
    "name": "net1",
    "type": "sluice",
    "ipam": {"type": "sluice-ipam", "subnet": "10.1.0.0/24"},
}


def conf(**overrides: Any):
    return parse({**BASE, **overrides})


def test_defaults() -> None:
    c = conf()
    assert (c.policy, c.ip_masq, c.mtu) == ("enforce", True, None)
    assert (c.state_dir, c.bpf_dir) == ("/var/lib/sluice", "/sys/fs/bpf/sluice")
    assert isinstance(c.ipam, NodeCIDRConfig)
    assert c.ipam.state_dir == "/var/lib/sluice"  # the plugin's stateDir
    assert c.cluster_cidr == ipaddress.IPv4Network("10.1.0.0/24")  # the IPAM's range


def test_prefix_mode_cluster_range_is_the_pool() -> None:
    c = conf(ipam={"type": "sluice-ipam", "mode": "prefix", "pool": "10.8.0.0/16"}, stateDir="/s")
    assert isinstance(c.ipam, PrefixConfig) and c.ipam.claims_dir == "/s/claims"
    assert c.cluster_cidr == ipaddress.IPv4Network("10.8.0.0/16")


def test_a_delegated_ipam_keeps_the_call_for_the_delegate() -> None:
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.2.0.0/24"}]]}
    c = parse({**BASE, "ipam": ipam}, stdin=b"{...}", cni_path=("/opt/cni/bin",), env={"A": "1"})
    assert c.ipam == DelegatedIPAM("host-local", b"{...}", ("/opt/cni/bin",), {"A": "1"})
    assert c.ipam_type == "host-local"
    assert c.cluster_cidr is None  # the delegate's own keys are not read
    assert conf(ipam=ipam, clusterCIDR="10.0.0.0/8").cluster_cidr == ipaddress.IPv4Network(
        "10.0.0.0/8"
    )


@pytest.mark.parametrize(
    ("key", "value", "code", "fragment"),
    [
        ("mtu", 70000, 7, '"mtu" 70000'),
        ("mtu", "1500", 7, "\"mtu\" '1500'"),
        ("ipMasq", "yes", 7, "\"ipMasq\" 'yes'"),
        ("policy", "audit", 7, "'audit'"),
        ("stateDir", "relative/dir", 7, "relative/dir"),
        ("clusterCIDR", "fd00::/8", 2, "fd00::/8"),
        ("clusterCIDR", "nonsense", 7, "nonsense"),
        ("ipam", {"subnet": "10.0.0.0/24"}, 7, '"ipam"'),
        ("ipam", {"type": "../evil"}, 7, "ipam.type"),
        ("ipam", {"type": "sluice-ipam", "subnet": "fd00::/64"}, 2, "fd00::/64"),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.0/31"}, 7, "too small"),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.1/24"}, 7, "host bits"),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.0/24", "mode": "magic"}, 2, "magic"),
        (
            "ipam",
            {"type": "sluice-ipam", "mode": "prefix", "pool": "10.0.0.0/24", "prefixLength": 20},
            7,
            "prefixLength",
        ),
        ("dns", {"nameservers": "1.1.1.1"}, 6, "nameservers"),
        ("tunnelPort", 0, 7, '"tunnelPort" 0'),
        ("tunnelPort", "4789", 7, "tunnelPort"),
        ("tunnelVNI", 1 << 24, 7, '"tunnelVNI" 16777216'),
        ("tunnelVNI", True, 7, "tunnelVNI"),
    ],
)
def test_invalid_values_are_named(key: str, value: object, code: int, fragment: str) -> None:
    with pytest.raises(CNIError) as err:
        conf(**{key: value})
    assert err.value.code == code, err.value.details
    assert fragment in err.value.details


def test_routing_modes() -> None:
    assert conf().routing == "native" and conf().encapsulation_overhead == 0
    tunnel = conf(routing="vxlan")
    assert tunnel.routing == "vxlan" and tunnel.encapsulation_overhead == 50
    with pytest.raises(CNIError) as refused:
        conf(routing="bgp")
    assert refused.value.code == 7 and "'bgp'" in refused.value.details
    with pytest.raises(CNIError) as unsupported:
        conf(routing="geneve")
    assert unsupported.value.code == 2


def test_tunnel_port_and_vni() -> None:
    assert (conf().tunnel_port, conf().tunnel_vni) == (4789, 7346)
    tunnel = conf(routing="vxlan", tunnelPort=8472, tunnelVNI=1)
    assert (tunnel.tunnel_port, tunnel.tunnel_vni) == (8472, 1)
