"""Prefix claims in the Kubernetes API: ``ipam.claims.ClaimStore`` over PrefixClaim
objects (``cni.kube.prefixclaims``), for one network of one node.

The API server is the only arbiter: a block is claimed by creating the object named
after it (``claimer``). Nothing else needs to be exact, so the store reads from a
cache (``claimcache``) kept by an informer (``cni.kube.informer``) on every
PrefixClaim and by the store's own writes. Only claims of one block of the pool
count; any other claim of the pool is refused, never adopted and never counted as
taken (``refused``).

- The informer is consistent: its list at start and after a 410 is read from etcd,
  not the watch cache, so a restarted agent sees every claim it made before.
- The store's own writes go into the cache at once, and the watch never takes the
  cache back (an event of a deleted uid or of an older ``metadata.generation`` is
  ignored).
- A stale cache costs at most a create that fails with 409, after which the
  winner's object is read and cached.

Usage (``status``), Events (``claimusage``) and the deletion of claims whose
cooldown is over (``Claimer.sweep``) go out from a background thread in rounds, at
most one per ``FLUSH_SECONDS``, never on a CNI call's path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cni.kube import prefixclaims
from cni.kube.api import Api, ApiError
from cni.kube.claimcache import ClaimCache
from cni.kube.claimer import Claimer
from cni.kube.claimusage import UsageReporter
from cni.kube.events import NodeEvents
from cni.kube.informer import Informer
from cni.work.queue import Worker, WorkQueue
from ipam.claims import Block, BlockUsage, Claim, Shortage
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable, StoreError

log = logging.getLogger("sluice.claims")

FLUSH_SECONDS = 0.5  # usage is published at most this often
SWEEP_SECONDS = 1.0  # released claims are looked at this often
ROUND = "round"  # the work queue's one key


class ApiClaimStore:
    def __init__(
        self,
        api: Api,
        config: PrefixConfig,
        events: NodeEvents | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.cache = ClaimCache(config)
        # Consistent: a restarted agent must see every claim it made before.
        self._informer = Informer(
            api, "prefixclaims", prefixclaims.PATH, _whole, self.cache, consistent=True
        )
        self.claimer = Claimer(api, config, self.cache, now)
        # Usage, shortages and released claims go out in rounds, at most one per
        # FLUSH_SECONDS: what changes meanwhile goes out together.
        self._work: WorkQueue[str] = WorkQueue()
        self._worker = Worker(
            "claims-work", self._work, self._round, log,
            expected=(ApiError, ClaimsUnavailable, StoreError), spacing=FLUSH_SECONDS,
        )  # fmt: skip
        self._next_sweep = 0.0
        self.usage = UsageReporter(
            api, self.cache, events, self.claimer.node_uid, lambda: self._work.add(ROUND)
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._informer.start()
        self._work.add(ROUND)  # then one every FLUSH_SECONDS or so: sweeps are periodic
        self._worker.start()

    def stop(self) -> None:
        """Publish what is pending, then stop (close the Api afterwards: that ends the
        watch's open request)."""
        self._informer.stop()
        self._worker.stop(timeout=10)
        try:
            self.usage.flush()
        except ApiError as err:
            log.warning("prefix claims: usage not published at stop: %s", err)

    def close(self) -> None:
        """Allocators share the store: their close leaves it open (``stop`` ends it)."""

    # -- the ClaimStore interface (called under the node store's write lock) -------------

    def claims(self) -> list[Claim]:
        return self.cache.claims()

    def claim(self, node: str, network: str) -> Block | None:
        return self.claimer.claim(node, network)

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        return self.claimer.claim_block(block, node, network)

    def release(self, block: Block, node: str) -> None:
        self.claimer.release(block, node)

    def report_usage(self, node: str, used: dict[Block, BlockUsage]) -> None:
        self.usage.report_usage(used)

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        self.usage.no_free_block(node, shortage)

    # -- what the agent reads and sets ------------------------------------------------------

    @property
    def synced(self) -> threading.Event:
        """Set once the claims have been listed."""
        return self.cache.synced

    @property
    def on_lost(self) -> Callable[[], None] | None:
        """Called (from the informer's thread) when a claim this node holds is deleted
        by somebody else."""
        return self.cache.on_lost

    @on_lost.setter
    def on_lost(self, callback: Callable[[], None] | None) -> None:
        self.cache.on_lost = callback

    @property
    def refused(self) -> dict[str, str]:
        """The claims of this pool that do not count, by name: why."""
        return self.cache.refused

    @property
    def conflicts(self) -> int:
        """Creates that lost to another node."""
        return self.claimer.conflicts

    @property
    def shortages(self) -> Counter[str]:
        """ADDs that found no block, by reason."""
        return self.usage.shortages

    def sweep(self) -> int:
        """Delete this node's released claims whose cooldown is over; how many."""
        return self.claimer.sweep()

    # -- background work ------------------------------------------------------------------------

    def _round(self, _key: str) -> float:
        self.usage.flush()
        self.usage.report_shortage()
        if time.monotonic() >= self._next_sweep and self.cache.synced.is_set():
            self.claimer.sweep()
            self._next_sweep = time.monotonic() + SWEEP_SECONDS
        return FLUSH_SECONDS


def _whole(raw: dict[str, Any]) -> dict[str, Any]:
    """The informer hands objects on as they are: the cache reads them itself (an
    unreadable or refused object is logged there, and a refused one's name kept)."""
    return raw
