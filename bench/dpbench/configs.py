"""The benchmark's configurations, samples and the rules of its policies."""

from __future__ import annotations

import ipaddress
import sys
import time
from dataclasses import dataclass, field

from cni.datapath import policy_install as P
from cni.datapath.events import DenyEvent
from cni.policy.vocabulary import AllowRule, EndpointPolicy, PeerCIDR, Ports

SUBNET = "10.213.0.0/24"
IPERF_PORT, RR_PORT, CRR_PORT = 5201, 5202, 5203
BENCH_PORTS = (IPERF_PORT, RR_PORT, CRR_PORT)
UNLISTED_PORT = 5299  # no rule allows it: the policy check expects a drop
MAX_PEERS = 65536  # one distinct peer per rule up to a /16
PASS_REASONS = ("allowed", "allowed-reply", "allowed-related", "deferred-service")
TARGET_RATIO = 0.95


@dataclass
class Pod:
    name: str  # netns and container id suffix
    ip: str = ""
    veth: str = ""
    ifindex: int = 0


@dataclass(frozen=True)
class Config:
    label: str
    programs: bool  # the sluice programs attached to both veths
    rules: int | None = None  # an ingress policy of this many rules on the server
    iptables: int | None = None  # an iptables chain of this many rules
    after_nat: bool = True  # with the programs: after_nat on netfilter's hooks too


CONFIGS = (
    Config("no program", programs=False),
    Config("program, no policy", programs=True),
    Config("program, 1,000 rules", programs=True, rules=1000),
    Config("program, 10,000 rules", programs=True, rules=10000),
    Config("iptables, 1,000 rules", programs=False, iptables=1000),
    # What after_nat alone costs: the programs without it (against "program, no policy").
    Config("program, no after_nat", programs=True, after_nat=False),
)


@dataclass
class Samples:
    gbits: list[float] = field(default_factory=list)
    retransmits: list[int] = field(default_factory=list)
    dsacked: list[int] = field(default_factory=list)  # retransmits the receiver already had
    rr: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    crr: list[float] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    kernel_drops: int = 0  # veth and backlog drops outside the datapath
    events: list[DenyEvent] = field(default_factory=list)  # the datapath's deny events


def other_peers(n: int) -> list[tuple[str, int]]:
    """n distinct (peer address, tcp port) pairs that the benchmark traffic never matches."""
    peers = min(n, MAX_PEERS)
    base = int(ipaddress.IPv4Address("172.16.0.1"))
    pairs = []
    for k in range(peers):
        count = n // peers + (k < n % peers)
        address = str(ipaddress.IPv4Address(base + k))
        pairs.extend((address, 10000 + (k * 131 + j * 1009) % 50000) for j in range(count))
    assert len(set(pairs)) == n
    return pairs


def build_policies(client_ip: str) -> tuple[dict[int, EndpointPolicy], dict[int, int]]:
    """{rules: policy} for every configuration with rules, and {rules: map entries}."""
    allow_client = AllowRule(
        peers=(PeerCIDR(f"{client_ip}/32"),),
        ports=tuple(Ports("tcp", port) for port in BENCH_PORTS),
    )
    policies: dict[int, EndpointPolicy] = {}
    sizes: dict[int, int] = {}
    for config in CONFIGS:
        if config.rules is None or config.rules in policies:
            continue
        by_peer: dict[str, list[int]] = {}
        for address, port in other_peers(config.rules - 1):
            by_peer.setdefault(address, []).append(port)
        rules = tuple(
            AllowRule(
                peers=(PeerCIDR(f"{address}/32"),),
                ports=tuple(Ports("tcp", port) for port in ports),
            )
            for address, ports in by_peer.items()
        )
        policy = EndpointPolicy(ingress=(allow_client, *rules))
        started = time.monotonic()
        sizes[config.rules] = P.size(policy)
        print(
            f"{config.rules} rules ({len(by_peer)} other peers): {sizes[config.rules]} map "
            f"entries, compiled in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        policies[config.rules] = policy
    return policies, sizes
