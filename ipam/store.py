"""The IPAM store: one SQLite database per network under ``<stateDir>/ipam``.

WAL journal with synchronous=FULL: a transaction is on disk once COMMIT
returns, and a process killed at any point leaves either the whole
transaction or none of it. Writers take the database's write lock with
BEGIN IMMEDIATE, so concurrent plugin processes serialise on it. The primary
key on the address makes a double allocation impossible even if the
allocation logic had a bug.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cni.errors import ERR_STORE, CNIError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_SECONDS = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS allocations (
    ip TEXT PRIMARY KEY,
    container_id TEXT NOT NULL,
    ifname TEXT NOT NULL,
    allocated_at REAL NOT NULL,
    pod_namespace TEXT NOT NULL DEFAULT '',
    pod_name TEXT NOT NULL DEFAULT '',
    UNIQUE (container_id, ifname)
);
CREATE TABLE IF NOT EXISTS cooling (
    ip TEXT PRIMARY KEY,
    released_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class AllocationRow:
    ip: str
    container_id: str
    ifname: str
    allocated_at: float
    pod_namespace: str
    pod_name: str


def store_path(state_dir: str, network: str) -> str:
    return os.path.join(state_dir, "ipam", f"{network}.db")


class Store:
    def __init__(self, path: str, network: str) -> None:
        self.path = path
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self._migrate(network)
        except (OSError, sqlite3.Error) as err:
            raise CNIError(ERR_STORE, f'failed to open IPAM store "{path}": {err}') from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, network: str) -> None:
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise CNIError(
                ERR_STORE,
                f'IPAM store "{self.path}" has format {version}, newer '
                f"than this sluice understands ({SCHEMA_VERSION})",
            )
        with self.transaction():
            (version,) = self.db.execute("PRAGMA user_version").fetchone()
            if version == 0:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('network', ?)", (network,))
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An exclusive write transaction, committed on success."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            raise CNIError(ERR_STORE, f'failed to lock IPAM store "{self.path}": {err}') from None
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as err:
            raise CNIError(
                ERR_STORE, f'failed to commit to IPAM store "{self.path}": {err}'
            ) from None

    # -- reads (inside or outside a transaction) ------------------------------

    def allocations(self) -> list[AllocationRow]:
        rows = self.db.execute(
            "SELECT ip, container_id, ifname, allocated_at, pod_namespace, pod_name "
            "FROM allocations"
        ).fetchall()
        return [AllocationRow(*row) for row in rows]

    def allocation_for(self, container_id: str, ifname: str) -> AllocationRow | None:
        row = self.db.execute(
            "SELECT ip, container_id, ifname, allocated_at, pod_namespace, pod_name "
            "FROM allocations WHERE container_id = ? AND ifname = ?",
            (container_id, ifname),
        ).fetchone()
        return AllocationRow(*row) if row else None

    def cooling(self) -> dict[str, float]:
        return dict(self.db.execute("SELECT ip, released_at FROM cooling").fetchall())

    # -- writes (inside a transaction) ----------------------------------------

    def insert_allocation(self, row: AllocationRow) -> None:
        self.db.execute(
            "INSERT INTO allocations VALUES (?, ?, ?, ?, ?, ?)",
            (
                row.ip,
                row.container_id,
                row.ifname,
                row.allocated_at,
                row.pod_namespace,
                row.pod_name,
            ),
        )
        self.db.execute("DELETE FROM cooling WHERE ip = ?", (row.ip,))

    def release(self, row: AllocationRow, released_at: float) -> None:
        self.db.execute(
            "DELETE FROM allocations WHERE ip = ? AND container_id = ? AND ifname = ?",
            (row.ip, row.container_id, row.ifname),
        )
        self.db.execute("INSERT OR REPLACE INTO cooling VALUES (?, ?)", (row.ip, released_at))

    def forget_cooled(self, before: float) -> None:
        self.db.execute("DELETE FROM cooling WHERE released_at < ?", (before,))
