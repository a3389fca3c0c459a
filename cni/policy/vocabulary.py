"""What a resolved policy is, in the terms every resolver produces and the datapath
compiles: allow rules of peers and ports, per endpoint and direction.

The resolvers (``cni.policy.resolve`` on a node, the controller's published
objects read back by ``cni.policy.published``), ``sluicectl explain`` and the
datapath (``cni.datapath.ruleset`` compiles, ``cni.datapath.policy_install``
installs) all speak these types, and this module imports nothing of sluice:
it sits below the datapath in the layers (tests/unit/test_layers.py), so the
policy layer needs nothing from the datapath to say what it wants.

Every CIDR has an address family (``PeerCIDR.family``); the datapath compiles
IPv4 peers and refuses others with a ``PolicyError`` naming the CIDR.

Besides the namespaced NetworkPolicy rules (``ingress``, ``egress``: isolation,
then allow rules), an endpoint's policy can hold ordered tiers of cluster-wide
rules that accept, deny or pass (``Tier``, ``TierRule``, ``Action``): the tiers
``before`` are judged first, in order, and the first rule that matches decides
(Pass: the next tier decides); then the NetworkPolicy rules; the tiers ``after``
only for a direction no NetworkPolicy isolates. The resolvers produce none yet
and the datapath refuses an endpoint policy with tiers by name, so a tier can
never be silently dropped on its way to the kernel.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum, IntEnum

# Protocol names of ``Ports`` and their IP protocol numbers ("any": every protocol).
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "any": 0}


class PolicyError(ValueError):
    pass


class Family(IntEnum):
    IPV4 = 4
    IPV6 = 6


@dataclass(frozen=True)
class Ports:
    """A protocol and destination ports: ``first`` and ``last`` both 0 mean any port;
    ``first`` alone one port; both a range (``first`` 0: the range 0..last)."""

    protocol: str = "tcp"
    first: int = 0
    last: int = 0  # 0: same as first

    @property
    def proto(self) -> int:
        try:
            return PROTOCOLS[self.protocol.lower()]
        except KeyError:
            raise PolicyError(f"unknown protocol {self.protocol!r}") from None

    @property
    def span(self) -> tuple[int, int]:
        last = self.last or self.first
        if not 0 <= self.first <= last <= 65535:
            raise PolicyError(f"invalid port range {self.first}-{self.last}")
        return self.first, last


@dataclass(frozen=True)
class PeerCIDR:
    """A peer range and the ranges inside it that are not peers (ipBlock's except)."""

    cidr: str
    excepts: tuple[str, ...] = ()

    @property
    def family(self) -> Family:
        """The CIDR's address family; PolicyError for a CIDR that does not parse, or an
        exception of the other family."""
        family = _family(self.cidr)
        for excepted in self.excepts:
            if _family(excepted) != family:
                raise PolicyError(f"exception {excepted!r} of {self.cidr!r} is of another family")
        return family


def _family(cidr: str) -> Family:
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError as err:
        raise PolicyError(f"invalid CIDR {cidr!r}: {err}") from None
    return Family(network.version)


@dataclass(frozen=True)
class AllowRule:
    """Traffic with any of ``peers`` (none: any peer) on any of ``ports`` (none: any)."""

    peers: tuple[PeerCIDR, ...] = ()
    ports: tuple[Ports, ...] = ()


class Action(Enum):
    """What a tier's rule does with the traffic it matches."""

    ACCEPT = "Accept"  # allowed, whatever later tiers say
    DENY = "Deny"  # dropped, whatever later tiers say
    PASS = "Pass"  # this tier has no say: the next one decides


@dataclass(frozen=True)
class TierRule:
    """``action`` for traffic with any of ``peers`` (none: any peer) on any of
    ``ports`` (none: any)."""

    action: Action
    peers: tuple[PeerCIDR, ...] = ()
    ports: tuple[Ports, ...] = ()


@dataclass(frozen=True)
class Tier:
    """One tier's cluster-wide rules for an endpoint, per direction, in the order they
    are judged: the first that matches decides; none matching, the next tier does."""

    name: str
    ingress: tuple[TierRule, ...] = ()
    egress: tuple[TierRule, ...] = ()


@dataclass(frozen=True)
class EndpointPolicy:
    """None for a direction: not isolated. A tuple of rules: isolated, these allowed.
    ``deny_node``: the node's own traffic to the pod is judged too. ``before`` and
    ``after``: the tiers judged before the NetworkPolicy rules, and after them for a
    direction they leave unisolated (module docstring)."""

    ingress: tuple[AllowRule, ...] | None = None
    egress: tuple[AllowRule, ...] | None = None
    deny_node: bool = False
    before: tuple[Tier, ...] = ()
    after: tuple[Tier, ...] = ()

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """Every cluster-wide tier, in the order judged."""
        return (*self.before, *self.after)
