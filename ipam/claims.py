"""Prefix claims: which node holds which aligned block of a pool.

Prefix mode goes through this small interface so that the place where
claims live can change: ``LocalClaimStore`` keeps them in a SQLite database
in a claims directory (one host, or several simulated nodes sharing the
directory); on a cluster they belong in the Kubernetes API.

Each claim also carries the number of addresses its holder uses, so that
any node can tell how many free addresses the pool still has, including
those stranded in blocks other nodes hold.
"""

from __future__ import annotations

import ipaddress
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


class Claim(NamedTuple):
    block: ipaddress.IPv4Network
    node: str
    network: str
    claimed_at: float
    used: int  # addresses the holder has allocated or cooling in the block


class ClaimStore(Protocol):
    def claim(self, node: str, network: str) -> ipaddress.IPv4Network | None:
        """Claim the lowest free aligned block for (node, network); None when none is free."""
        ...

    def claim_block(self, block: ipaddress.IPv4Network, node: str, network: str) -> bool:
        """Claim this very block; False if somebody holds it."""
        ...

    def release(self, block: ipaddress.IPv4Network, node: str) -> None:
        """Give a block back, if ``node`` holds it."""
        ...

    def report_usage(self, node: str, used: dict[ipaddress.IPv4Network, int]) -> None:
        """Publish how many addresses ``node`` uses in each of its blocks."""
        ...

    def claims(self) -> list[Claim]: ...


class LocalClaimStore:
    """Claims of one pool in ``<claimsDir>/<pool>.db``, shared through file locks."""

    def __init__(self, claims_dir: str, pool: ipaddress.IPv4Network, prefix_length: int) -> None:
        self.pool = pool
        self.prefix_length = prefix_length
        name = f"{pool.network_address}_{pool.prefixlen}-{prefix_length}.db"
        self.path = os.path.join(claims_dir, name)
        self.db = open_database(self.path)
        self.db.execute(CLAIMS_SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.db, f"claims {self.path}")

    def claim(self, node: str, network: str) -> ipaddress.IPv4Network | None:
        with self._transaction():
            taken = {row[0] for row in self.db.execute("SELECT cidr FROM claims")}
            blocks = self.pool.subnets(new_prefix=self.prefix_length)
            block = next((b for b in blocks if str(b) not in taken), None)
            if block is not None:
                self.db.execute(
                    "INSERT INTO claims VALUES (?, ?, ?, ?, 0)",
                    (str(block), node, network, time.time()),
                )
        return block

    def claim_block(self, block: ipaddress.IPv4Network, node: str, network: str) -> bool:
        with self._transaction():
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, 0)",
                (str(block), node, network, time.time()),
            )
        return cursor.rowcount == 1

    def release(self, block: ipaddress.IPv4Network, node: str) -> None:
        with self._transaction():
            self.db.execute("DELETE FROM claims WHERE cidr = ? AND node = ?", (str(block), node))

    def report_usage(self, node: str, used: dict[ipaddress.IPv4Network, int]) -> None:
        with self._transaction():
            self.db.executemany(
                "UPDATE claims SET used = ? WHERE cidr = ? AND node = ?",
                [(count, str(block), node) for block, count in used.items()],
            )

    def claims(self) -> list[Claim]:
        rows = self.db.execute(
            "SELECT cidr, node, network, claimed_at, used FROM claims"
        ).fetchall()
        return [
            Claim(ipaddress.IPv4Network(cidr), node, network, claimed_at, used)
            for cidr, node, network, claimed_at, used in rows
        ]
