"""Claiming, giving back and deleting the blocks of one pool as PrefixClaim objects
(``Claimer``), for one network of one node, choosing from a ``ClaimCache``.

The API server is the only arbiter: a block is claimed by creating the object named
after it, and a create that finds the name taken (409) lost the block to another
node. Nothing else needs to be exact, so candidates come from the cache; a stale
cache costs at most a create that fails with 409, after which the winner's object is
read and cached. Every object a write returns goes into the cache at once.

Candidates: the node first takes back a block it gave back whose cooldown is not
over; else the lowest free block; after a conflict, a block at random among the
lowest ``SPREAD`` free ones, so that nodes racing for blocks spread out instead of
colliding again. ``MAX_CONFLICTS`` conflicts in a row end the claim with an error.

Giving a block back sets ``spec.releasedAt``; the object is deleted (``sweep``) once
the network's ``cooldownSeconds`` have passed since, with the uid and resourceVersion
as preconditions, so a block taken back meanwhile stays.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from cni.kube import prefixclaims
from cni.kube.api import Api, ApiError
from cni.kube.claimcache import ClaimCache, Entry
from ipam.claims import Block
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable, StoreError

log = logging.getLogger("sluice.claims")

SPREAD = 32
MAX_CONFLICTS = 20


def _unreachable(err: ApiError) -> bool:
    return err.status == 0 or err.status == 429 or err.status >= 500


class Claimer:
    def __init__(
        self,
        api: Api,
        config: PrefixConfig,
        cache: ClaimCache,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.config = config
        self.pool = config.pool
        self.cache = cache
        self.now = now
        self.conflicts = 0  # creates that lost to another node
        self._lock = threading.Lock()

    def claim(self, node: str, network: str) -> Block | None:
        """A block taken back or newly created for (node, network); None if none is free."""
        self.cache.require_synced()
        node_uid = self.node_uid()
        conflicts = 0
        while True:
            for block in self.cache.released_by(node, network):
                if self._take_back(block):
                    return block
            candidates = self.cache.free_blocks(SPREAD)
            if not candidates:
                return None
            block = candidates[0] if conflicts == 0 else random.choice(candidates)
            if self._create(block, node, node_uid, network):
                return block
            conflicts += 1
            with self._lock:
                self.conflicts += 1
            if conflicts >= MAX_CONFLICTS:
                raise StoreError(
                    f"no block of pool {self.pool} claimed after {conflicts} conflicts in a "
                    "row: other nodes won each one"
                )

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        """Claim this very block (or take it back); True if (node, network) holds it."""
        self.cache.require_synced()
        why = self.cache.blocks.misfit(block, self.pool)
        if why is not None:
            raise StoreError(f"not claiming {block}: {why}")
        entry = self.cache.entry(block)
        if entry is None:
            if self._create(block, node, self.node_uid(), network):
                return True
            entry = self.cache.entry(block)
        if entry is None or (entry.claim.node, entry.claim.network) != (node, network):
            return False
        return entry.claim.held or self._take_back(block)

    def release(self, block: Block, node: str) -> None:
        """Give the block back: released now, deleted after the cooldown (at once
        without one)."""
        entry = self.cache.entry(block)
        if entry is None or entry.claim.node != node or not entry.claim.held:
            return
        if self.config.cooldown_seconds <= 0:
            self._delete(entry)
            return
        patch = {"spec": {"releasedAt": prefixclaims.rfc3339(self.now())}}
        self._write(lambda: self.api.patch(prefixclaims.path_of(block), patch), block)
        log.info("released block %s (deleted after %.0f s)", block, self.config.cooldown_seconds)

    def sweep(self) -> int:
        """Delete this node's released claims whose cooldown is over; how many."""
        deleted = 0
        for entry in self.cache.expired(self.now()):
            if self._delete(entry):
                deleted += 1
                log.info("deleted the claim of %s: its cooldown is over", entry.claim.block)
        return deleted

    def node_uid(self) -> str:
        """The uid of this node's Node: claims are owned by it."""
        node = self.config.node_name
        try:
            found = self.api.get(f"/api/v1/nodes/{node}")
        except ApiError as err:
            raise self._error(f"reading Node {node}", err) from None
        if found is None:
            raise ClaimsUnavailable(
                f"Node {node} is not registered in the Kubernetes API: prefix claims "
                "are owned by their Node"
            )
        return str(found["metadata"]["uid"])

    def _create(self, block: Block, node: str, node_uid: str, network: str) -> bool:
        """Create the block's claim: True if it is this call's, False if somebody's (the
        winner's object is cached then)."""
        obj = prefixclaims.claim_object(block, self.pool, node, node_uid, network)
        try:
            created = self.api.create(prefixclaims.PATH, obj)
        except ApiError as err:
            if err.status != 409:
                raise self._error(f"claiming {block}", err) from None
            self._refresh(block)
            return False
        self.cache.put(created)
        log.info("claimed block %s of pool %s", block, self.pool)
        return True

    def _take_back(self, block: Block) -> bool:
        """Take back a block this node gave back (its cooldown not over yet)."""
        entry = self.cache.entry(block)
        if entry is None or entry.claim.held:
            return entry is not None
        patch = {
            "metadata": {"resourceVersion": entry.resource_version},
            "spec": {"releasedAt": None},
        }
        try:
            self.cache.put(self.api.patch(prefixclaims.path_of(block), patch))
        except ApiError as err:
            if err.status not in (404, 409):
                raise self._error(f"taking back {block}", err) from None
            self._refresh(block)  # deleted or changed meanwhile: look again
            return False
        given_back = self.now() - (entry.claim.released_at or self.now())
        log.info("took back block %s, given back %.0f s ago", block, given_back)
        return True

    def _write(self, request: Callable[[], dict[str, Any]], block: Block) -> None:
        try:
            self.cache.put(request())
        except ApiError as err:
            if err.status == 404:
                self.cache.forget(prefixclaims.name_of(block), None)
                return
            raise self._error(f"writing the claim of {block}", err) from None

    def _delete(self, entry: Entry) -> bool:
        """Delete a claim if it is still the version read; False if it changed."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": entry.uid, "resourceVersion": entry.resource_version},
        }
        path = prefixclaims.path_of(entry.claim.block)
        with self.cache.deleting(entry.uid):
            try:
                # Api.delete sends no body; the preconditions need one.
                self.api._json("DELETE", path, json=options)
            except ApiError as err:
                if err.status == 409:
                    self._refresh(entry.claim.block)
                    return False
                if err.status != 404:
                    raise self._error(f"deleting the claim of {entry.claim.block}", err) from None
        self.cache.forget(prefixclaims.name_of(entry.claim.block), entry.uid)
        return True

    def _refresh(self, block: Block) -> None:
        try:
            obj = self.api.get(prefixclaims.path_of(block))
        except ApiError as err:
            raise self._error(f"reading the claim of {block}", err) from None
        if obj is None:
            self.cache.discard(prefixclaims.name_of(block))
        else:
            self.cache.put(obj)

    def _error(self, doing: str, err: ApiError) -> ClaimsUnavailable | StoreError:
        message = f"{doing} in the Kubernetes API failed: {err}"
        return ClaimsUnavailable(message) if _unreachable(err) else StoreError(message)
