"""Which claim store a prefix-mode network's claims go through.

``"claimStore": "local"`` (the default): ``LocalClaimStore`` under ``claimsDir``, for
one host.

``"claimStore": "kubernetes"``: the Kubernetes API, which only a process that holds
an API client reaches, the node agent. The IPAM knows nothing of Kubernetes (it
imports nothing of ``cni``), so that process provides the store (``provide``) and
every allocator it opens for such a network uses it. Any other process (the
``sluice`` executable run in-process because no agent answered, ``sluice-ipam``)
gets ``OfflineClaims``: it never falls back to a local store, which on a cluster
would hand the same block to two nodes. Its allocators still release addresses
(DEL and GC must work without the agent) and leave giving blocks back to the
agent; an ADD that needs the claims fails with ``ClaimsUnavailable``.
"""

from __future__ import annotations

from collections.abc import Callable

from ipam.claims import Block, BlockUsage, Claim, ClaimStore, LocalClaimStore, Shortage
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable

Provider = Callable[[PrefixConfig], ClaimStore]

_provider: Provider | None = None


def provide(provider: Provider | None) -> None:
    """From now on, this process's allocators of ``"claimStore": "kubernetes"`` networks
    take their claim store from ``provider`` (None: nobody provides one any more).
    The provider raises ``ClaimsUnavailable`` for a network it does not serve."""
    global _provider
    _provider = provider


def open_claim_store(config: PrefixConfig) -> ClaimStore:
    """The claim store of a prefix-mode network; close it when done."""
    if config.claim_store == "local":
        return LocalClaimStore(config.claims_dir, config.pool, config.prefix_length)
    if _provider is None:
        return OfflineClaims(config)
    return _provider(config)


class OfflineClaims:
    """Claims that live in the Kubernetes API, seen from a process without a client."""

    def __init__(self, config: PrefixConfig) -> None:
        self.config = config

    def _unavailable(self) -> ClaimsUnavailable:
        return ClaimsUnavailable(
            f"the prefix claims of pool {self.config.pool} live in the Kubernetes API "
            '("ipam.claimStore": "kubernetes"), which only the sluice agent reaches, and '
            f"no agent served this call for network {self.config.network!r}: start "
            "`sluicectl agent` (with --kubeconfig, or in a pod) on this node"
        )

    def claim(self, node: str, network: str) -> Block | None:
        raise self._unavailable()

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        raise self._unavailable()

    def release(self, block: Block, node: str) -> None:
        raise self._unavailable()

    def report_usage(self, node: str, used: dict[Block, BlockUsage]) -> None:
        raise self._unavailable()

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        pass

    def claims(self) -> list[Claim]:
        raise self._unavailable()

    def close(self) -> None:
        pass
