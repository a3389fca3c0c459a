"""What the pinned maps hold, read back into the terms they were written in.

``read_direction`` turns a policy id's two inner maps (peer LPM, rule hash) into
the ``CompiledDirection`` that ``ruleset.build_maps`` would have been given, so
that its digest can be compared with the digest of what a policy compiles to
now: equal digests, equal maps (``ruleset.digest``). The verification of a
running agent (``cni.agent.verify``) rests on it.
"""

from __future__ import annotations

import ipaddress
import os

from cni.datapath import bpf
from cni.datapath.maps import Datapath, iterate
from cni.datapath.ruleset import CompiledDirection
from cni.datapath.structs import Peer, PeerKey, Rule, RuleKey, ip_str, port_host


def inner_map_ids(datapath: Datapath) -> tuple[dict[int, int], dict[int, int]]:
    """({policy id: peer map id}, {policy id: rule map id}) as the outer maps hold them."""
    return datapath.inner_maps("peers"), datapath.inner_maps("rules")


def read_direction(peer_map_id: int, rule_map_id: int) -> CompiledDirection:
    """The entries of one rule set's inner maps. OSError when a map is gone."""
    compiled = CompiledDirection()
    peer_fd = bpf.map_get_fd_by_id(peer_map_id)
    try:
        for key in iterate(peer_fd, PeerKey):
            peer = Peer()
            if bpf.map_lookup(peer_fd, key, peer):
                network = ipaddress.IPv4Network(f"{ip_str(key.addr)}/{key.prefixlen}")
                compiled.peers[network] = peer.set
    finally:
        os.close(peer_fd)
    rule_fd = bpf.map_get_fd_by_id(rule_map_id)
    try:
        for key in iterate(rule_fd, RuleKey):
            rule = Rule()
            if bpf.map_lookup(rule_fd, key, rule):
                compiled.rules[(key.set, key.proto, port_host(key.port))] = rule
    finally:
        os.close(rule_fd)
    return compiled
