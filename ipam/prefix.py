"""Prefix mode: the node claims aligned blocks of a shared pool as it needs them.

- A block is claimed only when every block the node holds is full (plus
  ``warmPrefixes`` empty blocks kept in reserve, so an ADD rarely waits for
  a claim).
- A new address goes into the fullest block that still has room (ties: the
  lowest block), so that lightly used blocks drain and can be given back.
- A block with nothing allocated and nothing cooling is returned to the
  pool, except for the warm reserve.
- When no block is free the pool is fragmented or exhausted, and ADD fails
  with a message that says which.

Claims and the node's record of them live in two databases, so every change
to both happens while the node's store is locked, and each change begins by
reconciling them: a claim the node did not record (a crash after claiming)
is adopted; a recorded block the node no longer has a claim for (a crash
while giving it back) is dropped if it is empty, claimed again if it is not.
So no process can allocate from a block its node does not hold a claim for.

The claim store is the network's (``ipam.claim_stores``): local, or the Kubernetes
API through the agent. Without the agent, an allocator of an API-claimed network
still releases addresses (DEL and GC), and leaves giving blocks back and
publishing usage to the agent's next change or reconcile (``reconcile``, which the
agent runs at start and periodically).
"""

from __future__ import annotations

import contextlib
import ipaddress

from ipam import logs
from ipam.allocator import Allocator
from ipam.claim_stores import open_claim_store
from ipam.claims import BlockUsage, Claim, Shortage
from ipam.clock import Clock
from ipam.config import PrefixConfig
from ipam.errors import ClaimsUnavailable, NoAddress, StoreError
from ipam.space import aligned_blocks, free_in_block, largest_network, unclaimed_space
from ipam.store import Store

log = logs.get("sluice.ipam")
Block = ipaddress.IPv4Network


class PrefixAllocator(Allocator):
    config: PrefixConfig

    def __init__(self, config: PrefixConfig, store: Store, clock: Clock) -> None:
        super().__init__(config, store, clock)
        self.prefixlen = 32  # each pod owns one address; nothing is on-link
        self.claims = open_claim_store(config)

    def close(self) -> None:
        self.claims.close()
        super().close()

    # -- the node's view of its blocks (call inside a transaction) --------------

    def held(self) -> list[Block]:
        """Blocks this node holds, reconciled with the claim store (see above)."""
        recorded = {ipaddress.IPv4Network(cidr) for cidr in self.store.prefixes()}
        claims = {c.block: c for c in self.claims.claims()}
        mine = {b for b, c in claims.items() if self._is_mine(c)}
        for block in mine - recorded:
            log.warning("adopting block %s, claimed but not recorded", block)
            self.store.add_prefix(str(block), claims[block].claimed_at)
        for block in recorded - mine:
            self._reclaim(block, claims.get(block))
        return sorted(ipaddress.IPv4Network(cidr) for cidr in self.store.prefixes())

    def _is_mine(self, claim: Claim) -> bool:
        """This node holds the claim (a released one it no longer does)."""
        return claim.held and self._holder_is_me(claim)

    def _holder_is_me(self, claim: Claim) -> bool:
        return claim.node == self.config.node_name and claim.network == self.config.network

    def _reclaim(self, block: Block, claim: Claim | None) -> None:
        """A recorded block without this node's claim: drop it, or claim it back."""
        busy = [ip for ip in self._busy() if ipaddress.IPv4Address(ip) in block]
        if not busy:
            log.warning("dropping block %s: recorded, but no longer claimed", block)
            self.store.remove_prefix(str(block))
            return
        # Nobody's, or this node's own released claim (a crash while giving it back).
        if (claim is None or self._holder_is_me(claim)) and self.claims.claim_block(
            block, self.config.node_name, self.config.network
        ):
            log.warning("claimed block %s again: it still holds %s", block, busy)
            return
        owner = f"{claim.node}/{claim.network}" if claim else "nobody"
        raise StoreError(
            f"block {block} holds addresses {busy} of this node but is claimed by {owner}; "
            "run `sluicectl ipam check`",
        )

    def usage(self, held: list[Block]) -> dict[Block, int]:
        """Addresses allocated or cooling in each held block."""
        busy = [ipaddress.IPv4Address(ip) for ip in self._busy()]
        return {block: sum(1 for ip in busy if ip in block) for block in held}

    def block_usage(self, held: list[Block]) -> dict[Block, BlockUsage]:
        """What the node uses of each held block, as the claim store publishes it."""
        busy = [ipaddress.IPv4Address(ip) for ip in self._busy()]
        usage = {}
        for block in held:
            mine = [ip for ip in busy if ip in block]
            usage[block] = BlockUsage(len(mine), free_in_block(block, mine))
        return usage

    def _busy(self) -> set[str]:
        return {row.ip for row in self.store.allocations()} | set(self.cooling())

    def _claim(self) -> Block | None:
        block = self.claims.claim(self.config.node_name, self.config.network)
        if block is not None:
            self.store.add_prefix(str(block), self.clock.now().wall)
            log.info("claimed block %s from pool %s", block, self.config.pool)
        return block

    # -- allocation -------------------------------------------------------------

    def _after_allocate(self) -> None:
        self._keep_warm()
        self._after_change()

    def _choose(self) -> ipaddress.IPv4Address:
        held = self.held()
        busy = self._busy()
        usage = self.usage(held)
        open_blocks = [b for b in held if usage[b] < b.num_addresses]
        if open_blocks:
            block = max(open_blocks, key=lambda b: (usage[b], -int(b.network_address)))
            return next(ip for ip in block if str(ip) not in busy)
        claimed = self._claim()
        if claimed is not None:
            return claimed.network_address
        try:
            return self._longest_cooled(lambda ip: any(ip in b for b in held), "")
        except NoAddress:
            shortage = self.shortage()
            self.claims.no_free_block(self.config.node_name, shortage)
            raise NoAddress(shortage.message) from None

    def _reserve(self) -> int:
        """Free addresses the warm reserve asks for: warmPrefixes blocks' worth."""
        return self.config.warm_prefixes * self.config.block_size

    @staticmethod
    def _spare(usage: dict[Block, int]) -> int:
        return sum(block.num_addresses - used for block, used in usage.items())

    def _keep_warm(self) -> None:
        """Claim blocks until the free addresses held cover the warm reserve (best effort)."""
        while self._spare(self.usage(self.held())) < self._reserve():
            if self._claim() is None:
                break

    def _after_change(self) -> None:
        """Give back empty blocks the warm reserve does not need, highest first.

        The claim goes first, then the record; a crash in between leaves a
        record without a claim, which the next change drops (it is empty).
        Where the claims cannot be reached (an API-claimed network without the
        agent) the addresses are released all the same and the blocks stay for
        the agent to give back.
        """
        self._forget_cooled(self.clock.now())
        try:
            self._give_back()
        except ClaimsUnavailable as err:
            log.info("blocks are given back later: %s", err)

    def reconcile(self) -> list[Block]:
        """Adopt, drop or claim again what the claims and the node's records disagree
        on, give back what is not needed, publish usage; the blocks held after."""
        with self.changing():
            pass
        return sorted(ipaddress.IPv4Network(c) for c in self.store.prefixes())

    def _give_back(self) -> None:
        usage = self.usage(self.held())
        spare = self._spare(usage)
        for block in sorted((b for b, used in usage.items() if used == 0), reverse=True):
            if spare - block.num_addresses < self._reserve():
                break
            spare -= block.num_addresses
            self.claims.release(block, self.config.node_name)
            self.store.remove_prefix(str(block))
            log.info("returned empty block %s to pool %s", block, self.config.pool)

    def _after_commit(self) -> None:
        held = [ipaddress.IPv4Network(c) for c in self.store.prefixes()]
        with contextlib.suppress(ClaimsUnavailable):  # else the agent's next reconcile
            self.claims.report_usage(self.config.node_name, self.block_usage(held))

    # -- availability -------------------------------------------------------------

    def pool_free(self) -> int:
        """Addresses of the pool that nobody allocated or cools, this node's exactly."""
        own = self.usage([ipaddress.IPv4Network(c) for c in self.store.prefixes()])
        others = sum(
            c.used
            for c in self.claims.claims()
            if not (c.node == self.config.node_name and c.network == self.config.network)
        )
        return self.config.pool.num_addresses - others - sum(own.values())

    def free_blocks(self) -> int:
        """Blocks of the pool nobody claims."""
        claimed = [c.block for c in self.claims.claims()]
        space = unclaimed_space(self.config.pool, self.config.prefix_length, claimed)
        return aligned_blocks(space, self.config.prefix_length)

    def free_space(self) -> list[Block]:
        """Every free address of the pool as the largest aligned networks: unclaimed
        blocks, the free parts of this node's blocks, the free parts other holders
        published, and blocks given back but still in their cooldown."""
        pool = self.config.pool
        claims = self.claims.claims()
        recorded = [ipaddress.IPv4Network(c) for c in self.store.prefixes()]
        space = unclaimed_space(pool, self.config.prefix_length, [c.block for c in claims])
        for usage in self.block_usage(recorded).values():
            space.extend(usage.free)
        own = set(recorded)
        for c in claims:
            if c.block in own and self._is_mine(c):
                continue
            if not c.held:
                space.append(c.block)
            elif c.free:
                space.extend(n for n in c.free if n.subnet_of(pool))
        return list(ipaddress.collapse_addresses(space))

    def shortage(self) -> Shortage:
        """Why no block can be claimed: a fragmented pool, or an exhausted one."""
        free = self.pool_free()
        pool, length = self.config.pool, self.config.prefix_length
        if free <= 0:
            message = f"pool {pool} is exhausted: all {pool.num_addresses} addresses are in use"
            return Shortage("exhausted", message, 0, None)
        largest = largest_network(self.free_space())
        message = f"pool {pool} has {free} free addresses but no free aligned /{length}"
        if largest is not None:
            message += f" (the largest free aligned block is {largest})"
        return Shortage("fragmented", message, free, largest)

    def unavailable_reason(self) -> str | None:
        held = [ipaddress.IPv4Network(c) for c in self.store.prefixes()]
        taken = {row.ip for row in self.store.allocations()}
        room = sum(1 for b in held for ip in b if str(ip) not in taken)  # cooling counts
        if room > 0 or self.free_blocks() > 0:
            return None
        return self.shortage().message
