"""One direction's rules compiled to the entries of its two inner maps, and named by
what those entries are.

A direction's policy is a list of allow rules, each a set of peers (CIDRs,
each with exceptions) and a set of ports (protocol with a port, a port
range, any port, or any protocol).

Compilation:
- every CIDR and exception becomes a prefix of an LPM trie; the addresses
  whose longest listed prefix is P are matched by exactly the rules whose
  peers contain P and do not except it, so P maps to that set of rules (a
  "peer set"; equal sets share an id, and 0 is "no rule"); peer sets are
  numbered in the order of their prefixes, so equal rules compile to equal
  entries in every process, whatever their order;
- each peer set gets the union of its rules' ports as hash entries: exact
  ports, then per protocol an any-port flag and up to 8 ranges, then an
  any-protocol entry.

A compiled rule set's digest (SHA-256 of its entries, in order) is its name:
equal digests, equal maps, so endpoints whose rules compile alike share
one pair of inner maps (``cni.datapath.policy_registry``).
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from cni.datapath import bpf
from cni.datapath.structs import (
    MAX_RANGES,
    RULE_ANY_PORT,
    Peer,
    PeerKey,
    PortRange,
    Rule,
    RuleKey,
    ip_be,
    port_be,
)
from cni.policy.vocabulary import AllowRule, Family, PeerCIDR, PolicyError, Ports

NO_RULE = 0  # peer set id of addresses no rule matches
# Ranges a protocol cannot keep in its 8 slots are spelled out, up to this many ports.
MAX_EXPANDED_PORTS = 4096


@dataclass
class CompiledDirection:
    peers: dict[ipaddress.IPv4Network, int] = field(default_factory=dict)
    rules: dict[tuple[int, int, int], Rule] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.peers) + len(self.rules)


def _network(cidr: str) -> ipaddress.IPv4Network:
    if PeerCIDR(cidr).family != Family.IPV4:
        raise PolicyError(f"peer {cidr!r}: the datapath compiles IPv4 peers only")
    return ipaddress.IPv4Network(cidr, strict=False)


def _supernets(net: ipaddress.IPv4Network) -> list[tuple[int, int]]:
    """(address, length) of the network and every network containing it, as integers."""
    address = int(net.network_address)
    return [
        (address & (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF, length)
        for length in range(net.prefixlen, -1, -1)
    ]


def _key(net: ipaddress.IPv4Network) -> tuple[int, int]:
    return int(net.network_address), net.prefixlen


def compile_direction(rules: Iterable[AllowRule]) -> CompiledDirection:
    """Peer prefixes and rule entries for one direction (see the module doc).

    Prefixes are matched to rules through an index of the rules' CIDRs: a
    prefix looks up its at most 33 enclosing networks, so compiling costs
    about (prefixes x 33), not (prefixes x rules).
    """
    rules = list(rules)
    by_cidr: dict[tuple[int, int], list[tuple[int, frozenset[tuple[int, int]]]]] = {}
    prefixes: set[ipaddress.IPv4Network] = set()
    for index, rule in enumerate(rules):
        for peer in rule.peers or (PeerCIDR("0.0.0.0/0"),):
            net = _network(peer.cidr)
            excepts = [_network(e) for e in peer.excepts]
            by_cidr.setdefault(_key(net), []).append((index, frozenset(map(_key, excepts))))
            prefixes.add(net)
            prefixes.update(excepts)

    compiled = CompiledDirection()
    set_ids: dict[frozenset[int], int] = {frozenset(): NO_RULE}
    for prefix in sorted(prefixes):
        enclosing = _supernets(prefix)
        inside = set(enclosing)
        members = frozenset(
            index
            for net in enclosing
            for index, excepts in by_cidr.get(net, ())
            if excepts.isdisjoint(inside)  # no exception of this peer contains the prefix
        )
        compiled.peers[prefix] = set_ids.setdefault(members, len(set_ids))

    for members, set_id in set_ids.items():
        ports = [p for index in members for p in (rules[index].ports or (Ports("any"),))]
        _add_ports(compiled, set_id, ports)
    return compiled


def _add_ports(compiled: CompiledDirection, set_id: int, ports: list[Ports]) -> None:
    ranges: dict[int, list[tuple[int, int]]] = {}
    for entry in ports:
        proto, (first, last) = entry.proto, entry.span
        if proto == 0:
            compiled.rules[(set_id, 0, 0)] = Rule(flags=RULE_ANY_PORT)
        elif first == 0 and last == 0:
            compiled.rules[(set_id, proto, 0)] = Rule(flags=RULE_ANY_PORT)
        elif first == last:
            compiled.rules[(set_id, proto, first)] = Rule()
        else:
            ranges.setdefault(proto, []).append((first, last))
    for proto, spans in ranges.items():
        if (set_id, proto, 0) in compiled.rules:
            continue  # any port already
        merged = _merge(spans)
        kept, spelled = merged[:MAX_RANGES], merged[MAX_RANGES:]
        if sum(last - first + 1 for first, last in spelled) > MAX_EXPANDED_PORTS:
            raise PolicyError(
                f"too many port ranges for protocol {proto}: {len(merged)} "
                f"(at most {MAX_RANGES} plus {MAX_EXPANDED_PORTS} single ports)"
            )
        for first, last in spelled:
            for number in range(first, last + 1):
                compiled.rules[(set_id, proto, number)] = Rule()
        rule = Rule(nranges=len(kept))
        for i, (first, last) in enumerate(kept):
            rule.ranges[i] = PortRange(first, last)
        compiled.rules[(set_id, proto, 0)] = rule


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching ranges joined, widest first (they get the slots)."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return sorted(((a, b) for a, b in merged), key=lambda s: s[0] - s[1])


def build_maps(compiled: CompiledDirection) -> tuple[int, int]:
    """New inner maps (peer LPM, rule hash) filled with ``compiled``; the caller closes them."""
    peer_fd = bpf.map_create(
        bpf.MAP_TYPE_LPM_TRIE,
        ctypes.sizeof(PeerKey),
        ctypes.sizeof(Peer),
        max(1, len(compiled.peers)),
        bpf.F_NO_PREALLOC,
        "sl_peers",
    )
    try:
        rule_fd = bpf.map_create(
            bpf.MAP_TYPE_HASH,
            ctypes.sizeof(RuleKey),
            ctypes.sizeof(Rule),
            max(1, len(compiled.rules)),
            bpf.F_NO_PREALLOC,
            "sl_rules",
        )
    except BaseException:
        os.close(peer_fd)
        raise
    try:
        for prefix, set_id in compiled.peers.items():
            key = PeerKey(prefix.prefixlen, ip_be(prefix.network_address))
            bpf.map_update(peer_fd, key, Peer(set_id))
        for (set_id, proto, port), rule in compiled.rules.items():
            bpf.map_update(rule_fd, RuleKey(set_id, port_be(port), proto, 0), rule)
    except BaseException:
        os.close(peer_fd)
        os.close(rule_fd)
        raise
    return peer_fd, rule_fd


def digest(compiled: CompiledDirection) -> bytes:
    """SHA-256 of the rule set's map entries, in order: equal digests, equal maps."""
    hashed = hashlib.sha256(struct.pack("<II", len(compiled.peers), len(compiled.rules)))
    for prefix, set_id in sorted(compiled.peers.items()):
        hashed.update(struct.pack("<III", int(prefix.network_address), prefix.prefixlen, set_id))
    for (set_id, proto, port), rule in sorted(compiled.rules.items()):
        hashed.update(struct.pack("<III", set_id, proto, port) + bytes(rule))
    return hashed.digest()
