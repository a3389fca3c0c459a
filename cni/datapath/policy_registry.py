"""Rule sets shared by content: which policy id names which compiled rule set.

A policy id names one compiled rule set (a pair of inner maps: peers[id],
rules[id]) for as long as it exists: ids come from the ledger's counter,
taken under the state lock, and are never reused, so no two writers (the
agent, a plugin or sluicectl process) ever hand out one id for two
contents. The pinned ``policy_index`` (rule set digest -> id) lets every
writer find the id of a rule set that is already installed: installing it
on one more endpoint writes no map of maps at all.

``PolicyRegistry`` is one process's cache on top of that: rules -> digest
(each distinct rule set is compiled once), compiled rule sets while they
are being installed, and the ids it saw in the index. The agent keeps one for its
lifetime; an in-process caller uses a short-lived one. The index is the
truth, read under the state lock before an id is used: a reaper in another
process may have deleted the id since. Which endpoints use an id is read
from the pinned endpoint entries (the reaper counts them under the state
lock), not counted here, so it stays right whoever writes. The inner maps'
fds are closed once inserted: the outer maps hold the maps, and a node
with thousands of rule sets would run out of fds.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable

from cni.datapath import ruleset
from cni.datapath.maps import Datapath
from cni.datapath.ruleset import CompiledDirection
from cni.policy.vocabulary import AllowRule

Rules = tuple[AllowRule, ...]
CACHE_SIZE = 1024  # distinct rule sets whose digest a registry remembers


class PolicyRegistry:
    """Rule sets by content and the policy ids last seen for them; thread-safe."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._lock = threading.Lock()
        self._digests: OrderedDict[Rules, bytes] = OrderedDict()  # least recently used first
        self._pending: dict[bytes, CompiledDirection] = {}  # compiled, not yet installed
        self._ids: dict[bytes, int] = {}
        self._cache_size = cache_size

    def digest(self, rules: Rules) -> bytes:
        """The digest of a direction's rules, compiled the first time they are seen
        (PolicyError if they cannot be)."""
        with self._lock:
            found = self._digests.get(rules)
            if found is not None:
                self._digests.move_to_end(rules)
                return found
        compiled = ruleset.compile_direction(rules)  # outside the lock: it may take a while
        name = ruleset.digest(compiled)
        with self._lock:
            self._digests[rules] = name
            if len(self._digests) > self._cache_size:
                self._digests.popitem(last=False)
            if name not in self._ids:
                self._pending[name] = compiled
        return name

    def compiled(self, digest: bytes, rules: Rules) -> CompiledDirection:
        with self._lock:
            found = self._pending.get(digest)
        return found if found is not None else ruleset.compile_direction(rules)

    def known_id(self, digest: bytes) -> int | None:
        """The id last seen for the rule set: a hint, confirmed under the state lock."""
        with self._lock:
            return self._ids.get(digest)

    def confirm(self, digest: bytes, policy_id: int) -> None:
        with self._lock:
            self._ids[digest] = policy_id
            self._pending.pop(digest, None)
            if len(self._ids) > self._cache_size:
                self._ids.pop(next(iter(self._ids)))

    def settle(self, digests: Iterable[bytes]) -> None:
        """An install is over: its compiled rule sets are in maps now, or not needed."""
        with self._lock:
            for digest in digests:
                self._pending.pop(digest, None)

    def forget(self, digest: bytes) -> None:
        with self._lock:
            self._ids.pop(digest, None)


def build(
    registry: PolicyRegistry, contents: dict[bytes, Rules], digests: Iterable[bytes]
) -> dict[bytes, tuple[int, int]]:
    """New inner maps (peer fd, rule fd) for these rule sets; the caller closes them."""
    built: dict[bytes, tuple[int, int]] = {}
    try:
        for digest in digests:
            built[digest] = ruleset.build_maps(registry.compiled(digest, contents[digest]))
    except BaseException:
        close(built)
        raise
    return built


def close(built: dict[bytes, tuple[int, int]]) -> None:
    for peer_fd, rule_fd in built.values():
        os.close(peer_fd)
        os.close(rule_fd)


def resolve_ids(
    datapath: Datapath,
    registry: PolicyRegistry,
    contents: dict[bytes, Rules],
    built: dict[bytes, tuple[int, int]],
) -> dict[bytes, int]:
    """The policy id of every rule set in ``contents``; call with the state lock held.

    Rule sets the index knows keep their id (no map of maps is written). The
    others get new ids and are inserted in one batch per outer map (two grace
    periods, however many there are), using the maps in ``built`` (built here
    for any that is missing: one whose id was deleted since the caller looked).
    """
    ids: dict[bytes, int] = {}
    new: list[bytes] = []
    for digest in contents:
        pinned = datapath.policies.find(digest)
        if pinned is None:
            registry.forget(digest)
            new.append(digest)
        else:
            ids[digest] = pinned
            registry.confirm(digest, pinned)
    if not new:
        return ids
    built.update(build(registry, contents, [d for d in new if d not in built]))
    fresh = datapath.policies.allocate_ids(len(new))
    datapath.policies.insert(fresh, [built[d][0] for d in new], [built[d][1] for d in new])
    for digest, policy_id in zip(new, fresh, strict=True):
        datapath.policies.remember(digest, policy_id)
        registry.confirm(digest, policy_id)
        ids[digest] = policy_id
    return ids
