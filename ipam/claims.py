"""Prefix claims: which node holds which aligned block of a pool.

Prefix mode goes through this small interface so that the place where
claims live can change (``ipam.claim_stores`` picks one per network):

- ``LocalClaimStore`` keeps them in a SQLite database in a claims directory,
  for one host (or several simulated nodes on it sharing the directory). Never
  on a directory shared between hosts: SQLite's WAL keeps its index in shared
  memory, which only processes of one host see, and its locks are not reliable
  over network file systems such as NFS; two hosts would claim the same block.
- On a cluster the claims live in the Kubernetes API, one object per block
  (``cni.kube.claimstore``), reached through the node agent.

Each claim also carries what its holder uses of the block (how many addresses,
and which aligned parts are free), so that any node can tell how many free
addresses the pool still has, including those stranded in blocks other nodes
hold, and how large the largest free aligned part of the pool is.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sqlite3
import time
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from ipam.store import open_database, write_transaction

CLAIMS_SCHEMA = """
    CREATE TABLE IF NOT EXISTS claims (
        cidr TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        network TEXT NOT NULL,
        claimed_at REAL NOT NULL,
        used INTEGER NOT NULL DEFAULT 0
    )
"""
# Added later: the free parts of the block, as a JSON list of CIDRs (NULL: unknown).
FREE_COLUMN = "ALTER TABLE claims ADD COLUMN free TEXT"

Block = ipaddress.IPv4Network


class BlockUsage(NamedTuple):
    """What a holder uses of one block."""

    used: int  # addresses allocated or cooling
    free: tuple[Block, ...]  # the other addresses, as aligned networks


class Claim(NamedTuple):
    block: Block
    node: str
    network: str
    claimed_at: float
    used: int  # addresses the holder has allocated or cooling in the block
    free: tuple[Block, ...] | None = None  # the block's free parts; None: not published
    released_at: float | None = None  # given back, kept until its cooldown is over
    # The pool the claim states (None: none that reads as an IPv4 network).
    pool: Block | None = None

    @property
    def held(self) -> bool:
        return self.released_at is None


class PoolBlocks(NamedTuple):
    """A pool and the length of its blocks: every claim of the pool is one of them."""

    pool: Block
    prefix_length: int

    def misfit(self, block: Block, stated_pool: Block | None) -> str | None:
        """Why a claim of ``block`` stating ``stated_pool`` is not one block of the pool
        (None: it is). Every node routes a claimed block to its holder, so a claim of
        anything else (the cloud metadata address, the node network, a prefix over
        other nodes' blocks) is refused: never routed, adopted or counted as taken."""
        if stated_pool != self.pool:
            stated = "no IPv4 pool" if stated_pool is None else f"pool {stated_pool}"
            return f"it states {stated}, not {self.pool}"
        if not block.subnet_of(self.pool):
            return f"{block} is outside pool {self.pool}"
        if block.prefixlen != self.prefix_length:
            return f"{block} is a /{block.prefixlen}, not a /{self.prefix_length} block"
        return None


class Shortage(NamedTuple):
    """No free block could be claimed: why, in words and numbers."""

    reason: str  # "fragmented" (free addresses, no free aligned block) or "exhausted"
    message: str
    free_addresses: int
    largest_free: Block | None  # the largest aligned free network anywhere in the pool


class ClaimStore(Protocol):
    def claim(self, node: str, network: str) -> Block | None:
        """Claim a free aligned block for (node, network); None when none is free."""
        ...

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        """Claim this very block; True if (node, network) holds it now."""
        ...

    def release(self, block: Block, node: str) -> None:
        """Give a block back, if ``node`` holds it."""
        ...

    def report_usage(self, node: str, used: dict[Block, BlockUsage]) -> None:
        """Publish what ``node`` uses of each of its blocks."""
        ...

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        """An ADD found no block to claim (for the store to report where it reports)."""
        ...

    def claims(self) -> list[Claim]:
        """Every claim of the pool, released ones (still taken) included."""
        ...

    def close(self) -> None:
        """Done with it (a store shared by a process's allocators stays open)."""
        ...


class LocalClaimStore:
    """Claims of one pool in ``<claimsDir>/<pool>.db``, shared through file locks by the
    processes of one host."""

    def __init__(self, claims_dir: str, pool: Block, prefix_length: int) -> None:
        self.pool = pool
        self.prefix_length = prefix_length
        name = f"{pool.network_address}_{pool.prefixlen}-{prefix_length}.db"
        self.path = os.path.join(claims_dir, name)
        self.db = open_database(self.path)
        self.db.execute(CLAIMS_SCHEMA)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(claims)")}
        if "free" not in columns:
            try:
                self.db.execute(FREE_COLUMN)
            except sqlite3.OperationalError as err:  # another process added it first
                if "duplicate column" not in str(err):
                    raise

    def close(self) -> None:
        self.db.close()

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.db, f"claims {self.path}")

    def claim(self, node: str, network: str) -> Block | None:
        with self._transaction():
            taken = {row[0] for row in self.db.execute("SELECT cidr FROM claims")}
            blocks = self.pool.subnets(new_prefix=self.prefix_length)
            block = next((b for b in blocks if str(b) not in taken), None)
            if block is not None:
                self.db.execute(
                    "INSERT INTO claims VALUES (?, ?, ?, ?, 0, NULL)",
                    (str(block), node, network, time.time()),
                )
        return block

    def claim_block(self, block: Block, node: str, network: str) -> bool:
        with self._transaction():
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, 0, NULL)",
                (str(block), node, network, time.time()),
            )
            if cursor.rowcount == 1:
                return True
            holder = self.db.execute(
                "SELECT node, network FROM claims WHERE cidr = ?", (str(block),)
            ).fetchone()
        return tuple(holder or ()) == (node, network)

    def release(self, block: Block, node: str) -> None:
        with self._transaction():
            self.db.execute("DELETE FROM claims WHERE cidr = ? AND node = ?", (str(block), node))

    def report_usage(self, node: str, used: dict[Block, BlockUsage]) -> None:
        with self._transaction():
            self.db.executemany(
                "UPDATE claims SET used = ?, free = ? WHERE cidr = ? AND node = ?",
                [
                    (usage.used, json.dumps([str(n) for n in usage.free]), str(block), node)
                    for block, usage in used.items()
                ],
            )

    def no_free_block(self, node: str, shortage: Shortage) -> None:
        """Nothing to report beyond the ADD's error and the log on one host."""

    def claims(self) -> list[Claim]:
        rows = self.db.execute(
            "SELECT cidr, node, network, claimed_at, used, free FROM claims"
        ).fetchall()
        return [
            Claim(
                ipaddress.IPv4Network(cidr),
                node,
                network,
                claimed_at,
                used,
                tuple(ipaddress.IPv4Network(n) for n in json.loads(free)) if free else None,
                pool=self.pool,  # one pool per database
            )
            for cidr, node, network, claimed_at, used, free in rows
        ]
