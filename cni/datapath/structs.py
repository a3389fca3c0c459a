"""ctypes mirrors of bpf/sluice.h (a test compares sizes and offsets with C)."""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost a one-call process
import ctypes
import ipaddress

from cni.datapath.vocabulary import Direction, Reason

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64

DIR_EGRESS = int(Direction.EGRESS)
DIR_INGRESS = int(Direction.INGRESS)
DIR_NETWORK = int(Direction.NETWORK)
# A pod's two directions (each with a policy id in its endpoint entry).
DIRECTIONS = {DIR_EGRESS: Direction.EGRESS.label, DIR_INGRESS: Direction.INGRESS.label}
# Every direction packets are counted in.
COUNTED_DIRECTIONS = {int(d): d.label for d in Direction}
# Counter and drop reasons, in the order of their values.
REASONS = tuple(r.label for r in Reason)

EP_DENY_NODE = 1 << 0

NONE = 0  # no policy (the direction is not isolated), no conntrack slot

RULE_ANY_PORT = 1 << 0
MAX_RANGES = 8

CT_FLOW = 0
CT_FRAG = 1
# ct_tables[slot] holds the flows an endpoint opened, ct_tables[slot | CT_INBOUND]
# the flows opened toward it: each direction evicts only its own share.
CT_INBOUND = 1 << 31
CT_SHARES = (False, True)  # outbound, inbound

CT_SEEN_REPLY = 1 << 0
CT_FIN_ORIG = 1 << 1
CT_FIN_REPLY = 1 << 2
CT_RST = 1 << 3
CT_FROM_NODE = 1 << 4
CT_SERVICE = 1 << 5
CT_POST_DNAT = 1 << 6
CT_SELF = 1 << 7

SVC_CLUSTER_IP = 1 << 0

RANGE_LOCAL = 1 << 0  # this node's own pod range
RANGE_UNOWNED = 1 << 1  # inside the cluster's pod range, held by no node known


def ip_be(address: str | ipaddress.IPv4Address) -> int:
    """An IPv4 address as the u32 whose memory holds it in network byte order."""
    return int.from_bytes(ipaddress.IPv4Address(address).packed, "little")


def ip_str(value: int) -> str:
    return str(ipaddress.IPv4Address(value.to_bytes(4, "little")))


def port_be(port: int) -> int:
    return _socket.htons(port)


def port_host(value: int) -> int:
    return _socket.ntohs(value)


class Endpoint(ctypes.Structure):
    _fields_ = [
        ("ip", u32),
        ("policy_gen", u32),
        ("flags", u32),
        ("ct_slot", u32),
        ("egress_policy", u32),
        ("ingress_policy", u32),
    ]

    def policy(self, direction: int) -> int:
        """The policy id of a direction (NONE: not isolated)."""
        return int(self.egress_policy if direction == DIR_EGRESS else self.ingress_policy)


class PeerKey(ctypes.Structure):
    _fields_ = [("prefixlen", u32), ("addr", u32)]


class Peer(ctypes.Structure):
    _fields_ = [("set", u32)]


class RuleKey(ctypes.Structure):
    _fields_ = [("set", u32), ("port", u16), ("proto", u8), ("pad", u8)]


class PortRange(ctypes.Structure):
    _fields_ = [("first", u16), ("last", u16)]


class Rule(ctypes.Structure):
    _fields_ = [("flags", u32), ("nranges", u32), ("ranges", PortRange * MAX_RANGES)]


class CTKey(ctypes.Structure):
    _fields_ = [
        ("saddr", u32),
        ("daddr", u32),
        ("sport", u16),
        ("dport", u16),
        ("proto", u8),
        ("kind", u8),
        ("pad", u8 * 2),
    ]


class CTEntry(ctypes.Structure):
    _fields_ = [
        ("last_seen", u64),
        ("policy_gen", u32),
        ("flags", u32),
        ("dir", u8),
        ("pad", u8),
        ("sport", u16),
        ("dport", u16),
        ("pad2", u16),
    ]


class EpStats(ctypes.Structure):
    _fields_ = [("ct_created", u64), ("ct_removed", u64)]


class Config(ctypes.Structure):
    _fields_ = [
        ("ct_tcp_syn", u32),
        ("ct_tcp_established", u32),
        ("ct_tcp_closing", u32),
        ("ct_udp", u32),
        ("ct_other", u32),
        ("ct_fragment", u32),
        ("events_per_second", u32),
        ("events_burst", u32),
        ("ct_per_endpoint", u32),
        ("tunnel_port", u16),  # network order; 0: no tunnel
        ("pad", u16),
        ("tunnel_vni", u32),
        ("after_nat", u32),  # 1: bpf/after_nat.c judges service flows after DNAT
    ]


class PodRange(ctypes.Structure):
    _fields_ = [("node", u32), ("flags", u32)]


class Event(ctypes.Structure):
    _fields_ = [
        ("timestamp", u64),
        ("saddr", u32),
        ("daddr", u32),
        ("sport", u16),
        ("dport", u16),
        ("ifindex", u32),
        ("proto", u8),
        ("dir", u8),
        ("reason", u8),
        ("pad", u8),
        ("pad2", u32),
    ]


class EventBudget(ctypes.Structure):
    _fields_ = [("last", u64), ("tokens", u64)]


class PolicyDigest(ctypes.Structure):
    _fields_ = [("bytes", u8 * 32)]


class Ledger(ctypes.Structure):
    _fields_ = [
        ("next_policy_id", u32),
        ("next_ct_slot", u32),
        ("released_tables", u32),
        ("released_policies", u32),
    ]


# Every struct with its C name, for the layout test.
MIRRORS = {
    "sl_endpoint": Endpoint,
    "sl_peer_key": PeerKey,
    "sl_peer": Peer,
    "sl_rule_key": RuleKey,
    "sl_port_range": PortRange,
    "sl_rule": Rule,
    "sl_ct_key": CTKey,
    "sl_ct_entry": CTEntry,
    "sl_ep_stats": EpStats,
    "sl_pod_range": PodRange,
    "sl_config": Config,
    "sl_event": Event,
    "sl_event_budget": EventBudget,
    "sl_policy_digest": PolicyDigest,
    "sl_ledger": Ledger,
}
