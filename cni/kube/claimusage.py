"""What a node reports about its claims (``UsageReporter``): the usage of each block it
holds (the claim's ``status``, which is how other nodes know the pool's free
addresses) and the ADDs that found no block to claim (a Warning Event on its Node).

Both are only collected on a CNI call's path; they go out from the claim store's
background rounds (``flush`` and ``report_shortage``), so a slow or failing API
server never delays an ADD. Usage that changes between two rounds goes out once,
as it is at the round.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

from cni.kube import prefixclaims
from cni.kube.api import Api, ApiError
from cni.kube.claimcache import ClaimCache
from cni.kube.events import NodeEvents
from ipam.claims import Block, BlockUsage, Shortage

log = logging.getLogger("sluice.claims")

REASONS = {"fragmented": "PrefixPoolFragmented", "exhausted": "PrefixPoolExhausted"}


class UsageReporter:
    def __init__(
        self,
        api: Api,
        cache: ClaimCache,
        events: NodeEvents | None,
        node_uid: Callable[[], str],
        wake: Callable[[], None],
    ) -> None:
        """``node_uid`` reads the uid of the node's Node (for its Events); ``wake``
        asks for a round soon."""
        self.api = api
        self.cache = cache
        self.events = events
        self.node_uid = node_uid
        self.wake = wake
        self.shortages: Counter[str] = Counter()  # ADDs that found no block, by reason
        self._lock = threading.Lock()
        self._pending: dict[Block, BlockUsage] = {}
        self._published: dict[Block, BlockUsage] = {}
        self._shortage: Shortage | None = None

    def report_usage(self, used: dict[Block, BlockUsage]) -> None:
        """Note what changed since it was last published."""
        with self._lock:
            for block, usage in used.items():
                if self._published.get(block) != usage:
                    self._pending[block] = usage
        if self._pending:
            self.wake()

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        """Count and log an ADD that found no block; the latest goes out as an Event."""
        with self._lock:
            self.shortages[shortage.reason] += 1
            self._shortage = shortage
        log.warning("no block to claim for node %s: %s", node, shortage.message)
        self.wake()

    def flush(self) -> None:
        """Publish the pending usage (a claim gone meanwhile is skipped); ApiError
        leaves what failed pending."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for block, usage in pending.items():
            path = prefixclaims.path_of(block) + "/status"
            try:
                self.cache.put(self.api.patch(path, prefixclaims.usage_status(usage)))
            except ApiError as err:
                if err.status != 404:
                    with self._lock:
                        self._pending.setdefault(block, usage)
                    raise
                continue
            with self._lock:
                self._published[block] = usage

    def report_shortage(self) -> None:
        """Post the latest shortage, if any, as a Warning Event on the Node."""
        with self._lock:
            shortage, self._shortage = self._shortage, None
        if shortage is None or self.events is None:
            return
        self.events.warning(REASONS[shortage.reason], shortage.message, self.node_uid())
