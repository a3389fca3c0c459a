"""The agent's prefix claims in the Kubernetes API (``"ipam.claimStore": "kubernetes"``).

The agent is the only process with an API client, so every allocation of such a
network that needs the claims goes through it: it provides its ``ApiClaimStore``
to the IPAM (``ipam.claim_stores.provide``) for the allocators its CNI calls,
metrics and sluicectl's requests open. A call that runs in the ``sluice``
executable's own process (no agent answered) gets no store and fails an ADD with
code 11; its DEL still releases the address, and the agent gives the emptied
block back later.

At start the claims are listed (a consistent read) before the socket opens, and
the node's records and its claims are reconciled: a claim this node made but did
not record (a crash between the claim and its use) is adopted, and given back if
the warm reserve does not need it; a recorded block whose claim is gone is
claimed again while it holds addresses. The same reconciliation runs every
``RECONCILE_SECONDS`` (it gives back blocks whose last address cooled down after
the last change) and at once when one of the node's claims is deleted by
somebody else (the Node's deletion, an operator).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cni.kube.api import Api
from cni.kube.claimstore import ApiClaimStore
from cni.kube.claimusage import REASONS
from cni.kube.events import NodeEvents
from cni.work.queue import Worker, WorkQueue
from ipam import claim_stores
from ipam.claims import ClaimStore
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable, IPAMError
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator

log = logging.getLogger("sluice.claims")

SYNC_WAIT = 30.0  # the agent's start waits this long for the first list of claims
RECONCILE_SECONDS = 30.0
UNSYNCED_RETRY_SECONDS = 1.0  # until the claims are listed
PASS = "reconcile"  # the work queue's one key


def uses_api_claims(ipam: Any) -> bool:
    return isinstance(ipam, PrefixConfig) and ipam.claim_store == "kubernetes"


class ClaimsConfigError(ValueError):
    """The network asks for claims in the API where this process cannot serve them."""


def check_agent_config(conf: Any, node_name: str, from_api: bool) -> None:
    """ClaimsConfigError when the agent could not serve the network's claims."""
    if not uses_api_claims(conf.ipam):
        return
    if not from_api:
        raise ClaimsConfigError(
            f"network {conf.network!r} keeps its prefix claims in the Kubernetes API "
            '("ipam.claimStore": "kubernetes"): the agent needs --kubeconfig, or to run in a pod'
        )
    if conf.ipam.node_name != node_name:
        raise ClaimsConfigError(
            f'"ipam.nodeName" is {conf.ipam.node_name!r} but the agent runs for node '
            f"{node_name!r}: the claims are owned by the Node, so the two must agree "
            '(set "ipam.nodeName", or the agent\'s --node-name)'
        )


def for_agent(
    conf: Any, node_name: str, kubeconfig: str | None, from_api: bool
) -> AgentClaims | None:
    """The claims of the agent's network when they live in the API, else None."""
    if not uses_api_claims(conf.ipam):
        return None
    check_agent_config(conf, node_name, from_api)
    return AgentClaims(conf.ipam, kubeconfig)


class AgentClaims:
    def __init__(self, config: PrefixConfig, kubeconfig: str | None) -> None:
        self.config = config
        self.api = Api(kubeconfig)
        self.store = ApiClaimStore(self.api, config, NodeEvents(self.api, config.node_name))
        self.store.on_lost = self._changed
        self._queue: WorkQueue[str] = WorkQueue()
        self._worker = Worker("claims-reconcile", self._queue, self._pass, log)

    def start(self) -> None:
        """List the claims (waiting up to SYNC_WAIT), provide the store, reconcile."""
        self.store.start()
        if not self.store.synced.wait(SYNC_WAIT):
            log.warning(
                "prefix claims not listed after %.0f s; ADDs that need a block fail with "
                "code 11 until they are",
                SYNC_WAIT,
            )
        claim_stores.provide(self._provide)
        self._queue.add(PASS)
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        claim_stores.provide(None)
        self.store.stop()
        self.api.close()

    def _provide(self, config: PrefixConfig) -> ClaimStore:
        if config != self.config:
            raise ClaimsUnavailable(
                f"this agent serves the prefix claims of network {self.config.network!r} "
                f"(pool {self.config.pool}), not those of {config.network!r} (pool {config.pool})"
            )
        return self.store

    def _changed(self) -> None:
        self._queue.add(PASS)

    def _pass(self, _key: str) -> float:
        if not self.store.synced.is_set():
            return UNSYNCED_RETRY_SECONDS  # nothing to reconcile against yet
        self.reconcile()
        return RECONCILE_SECONDS

    def reconcile(self) -> list[str]:
        """One reconciliation of the node's records and its claims; the blocks held."""
        try:
            with open_allocator(self.config, threads=True) as allocator:
                assert isinstance(allocator, PrefixAllocator)
                held = allocator.reconcile()
        except IPAMError as err:
            log.warning("reconciling the prefix claims failed: %s", err)
            return []
        log.debug("reconciled: node %s holds %s", self.config.node_name, held)
        return [str(b) for b in held]

    def collector(self) -> Collector:
        return _ClaimMetrics(self)


class _ClaimMetrics(Collector):
    """Read at scrape time, from the claims' cache and the node's store."""

    def __init__(self, claims: AgentClaims) -> None:
        self.claims = claims

    def collect(self) -> Iterator[Any]:
        store, config = self.claims.store, self.claims.config
        network = [config.network]
        shortages = CounterMetricFamily(
            "sluice_ipam_no_free_block",
            "ADDs that found no free aligned block to claim, by reason: fragmented (the "
            "pool still has free addresses) or exhausted.",
            labels=["network", "reason"],
        )
        for reason in REASONS:
            shortages.add_metric([*network, reason], store.shortages[reason])
        yield shortages
        conflicts = CounterMetricFamily(
            "sluice_ipam_claim_conflicts",
            "Claims this node lost to another node (a create that found the block taken).",
            labels=["network"],
        )
        conflicts.add_metric(network, store.conflicts)
        yield conflicts
        refused = GaugeMetricFamily(
            "sluice_ipam_claims_refused",
            "PrefixClaims that state or overlap the pool but are no block of it (another "
            "length, outside it, another pool): neither adopted nor taken (logged).",
            labels=["network"],
        )
        refused.add_metric(network, len(store.refused))
        yield refused
        if not store.synced.is_set():
            return
        try:
            with open_allocator(config, threads=True) as allocator:
                assert isinstance(allocator, PrefixAllocator)
                space = allocator.free_space()
                claims = allocator.claims.claims()
        except IPAMError as err:
            log.warning("metrics: cannot read the prefix claims: %s", err)
            return
        largest = min((n.prefixlen for n in space), default=None)
        size = GaugeMetricFamily(
            "sluice_ipam_largest_free_aligned_block_addresses",
            "Addresses in the largest aligned block of free addresses anywhere in the pool "
            "(in blocks other nodes hold too); below the block size, no block can be "
            "claimed however many addresses are free.",
            labels=["network"],
        )
        size.add_metric(network, 2 ** (32 - largest) if largest is not None else 0)
        yield size
        held = GaugeMetricFamily(
            "sluice_ipam_claims",
            "PrefixClaims of the pool, by holder (this node or others) and state (held, or "
            "released and waiting for its cooldown).",
            labels=["network", "holder", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for c in claims:
            mine = (c.node, c.network) == (config.node_name, config.network)
            key = ("node" if mine else "others", "held" if c.held else "released")
            counts[key] = counts.get(key, 0) + 1
        for holder in ("node", "others"):
            for state in ("held", "released"):
                held.add_metric([*network, holder, state], counts.get((holder, state), 0))
        yield held


@contextmanager
def api_claims(config: PrefixConfig, kubeconfig: str | None) -> Iterator[ApiClaimStore]:
    """The claims of ``config`` from the API for this process's allocators, for a short
    command (sluicectl): listed once and watched until the block ends."""
    api = Api(kubeconfig)
    store = ApiClaimStore(api, config)
    store.start()
    try:
        if not store.synced.wait(SYNC_WAIT):
            raise ClaimsUnavailable(
                f"the prefix claims of pool {config.pool} could not be listed from the "
                f"Kubernetes API within {SYNC_WAIT:.0f} s"
            )
        claim_stores.provide(lambda c: store if c == config else claim_stores.OfflineClaims(c))
        yield store
    finally:
        claim_stores.provide(None)
        store.stop()
        api.close()
