"""The policies' maps: ``peers`` and ``rules`` (maps of maps: a rule set's two
inner maps under its policy id; every write costs an RCU grace period, so they
are written in batches) and ``policy_index`` (rule set digest -> policy id, for
userspace only: equal rule sets share one id)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from cni.datapath import bpf
from cni.datapath.structs import PolicyDigest

if TYPE_CHECKING:
    from cni.datapath.maps import Datapath


class PolicyMaps:
    def __init__(self, datapath: Datapath) -> None:
        self.dp = datapath

    def allocate_ids(self, count: int) -> list[int]:
        return self.dp.allocate("next_policy_id", count)

    def insert(self, ids: list[int], peer_fds: list[int], rule_fds: list[int]) -> None:
        """Make ``peers[id]`` and ``rules[id]`` the given inner maps: two grace periods,
        whatever the number of ids."""
        self.dp.insert_inner("peers", ids, peer_fds)
        self.dp.insert_inner("rules", ids, rule_fds)

    def delete(self, policy_id: int) -> None:
        self.dp.delete_inner("peers", policy_id)
        self.dp.delete_inner("rules", policy_id)

    def ids(self) -> set[int]:
        """Every policy id that has a peer or a rule map."""
        return set(self.dp.inner_maps("peers")) | set(self.dp.inner_maps("rules"))

    def index(self) -> dict[bytes, int]:
        """{rule set digest: policy id}."""
        found = bpf.map_lookup_batch(self.dp.fd("policy_index"), PolicyDigest, ctypes.c_uint32)
        return {bytes(key.bytes): policy_id for key, policy_id in found}

    def find(self, digest: bytes) -> int | None:
        value = ctypes.c_uint32()
        found = bpf.map_lookup(self.dp.fd("policy_index"), _digest(digest), value)
        return value.value if found else None

    def remember(self, digest: bytes, policy_id: int) -> None:
        bpf.map_update(self.dp.fd("policy_index"), _digest(digest), ctypes.c_uint32(policy_id))

    def forget(self, digest: bytes) -> None:
        bpf.map_delete(self.dp.fd("policy_index"), _digest(digest))


def _digest(digest: bytes) -> PolicyDigest:
    key = PolicyDigest()
    ctypes.memmove(key.bytes, digest, len(key.bytes))
    return key
