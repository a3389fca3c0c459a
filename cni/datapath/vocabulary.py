"""The datapath's vocabulary for Python: directions and reasons.

bpf/vocabulary.h declares the same values for C; a test parses it and
compares. A direction is always from the pod's point of view: EGRESS is
what the pod sends (tcx ingress of its node-side veth), INGRESS what it
receives (tcx egress of the node-side veth); NETWORK is what the node's
uplinks receive from the node network (no pod's policy: the checks on
sources that claim to be pods).
"""

from __future__ import annotations

from enum import IntEnum


class Direction(IntEnum):
    EGRESS = 0  # from the pod: tcx ingress of the node-side veth
    INGRESS = 1  # to the pod: tcx egress of the node-side veth
    NETWORK = 2  # from the node network: tcx ingress of an uplink

    @property
    def label(self) -> str:
        return self.name.lower()


class Reason(IntEnum):
    """Why a packet passed or was dropped; counters and events name these."""

    ALLOWED = 0
    ALLOWED_REPLY = 1
    DENIED_POLICY = 2
    DROP_SPOOFED = 3
    DROP_FRAGMENT = 4
    DROP_MALFORMED = 5
    DROP_UNSUPPORTED = 6
    DROP_NO_ENDPOINT = 7
    DROP_FLOW_CUT = 8
    ALLOWED_RELATED = 9
    DROP_ICMP_ERROR = 10
    DEFERRED_SERVICE = 11
    DROP_TUNNEL_PORT = 12
    DROP_TUNNEL_PEER = 13
    DROP_FORGED_SOURCE = 14
    DROP_UNJUDGED = 15

    @property
    def label(self) -> str:
        """The name counters and events use: ``drop-spoofed``."""
        return self.name.lower().replace("_", "-")

    @property
    def passes(self) -> bool:
        return self in PASSING


PASSING = frozenset(
    {Reason.ALLOWED, Reason.ALLOWED_REPLY, Reason.ALLOWED_RELATED, Reason.DEFERRED_SERVICE}
)
