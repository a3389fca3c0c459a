"""The IPAM store: one SQLite database per network under ``<stateDir>/ipam``.

WAL journal with synchronous=FULL: a transaction is on disk once COMMIT
returns, and a process killed at any point leaves either the whole
transaction or none of it. Writers take the database's write lock with
BEGIN IMMEDIATE, so concurrent plugin processes (and the agent) serialise on
it. The primary key on the address makes a double allocation impossible even
if the allocation logic had a bug.

Format history (``PRAGMA user_version``):
1. allocations, cooling, meta
2. + prefixes (blocks held in prefix mode); meta "config" keeps the network's
   IPAM configuration, so a store can be read without its conflist
3. + time since boot and boot id beside every wall-clock time of allocations
   and cooling addresses (see ``ipam.clock``)
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

from ipam.clock import Instant
from ipam.errors import StoreError
from ipam.wal import keep_wal_between_processes

SCHEMA_VERSION = 3
BUSY_TIMEOUT_SECONDS = 60.0

MIGRATIONS = {
    1: """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE allocations (
            ip TEXT PRIMARY KEY,
            container_id TEXT NOT NULL,
            ifname TEXT NOT NULL,
            allocated_at REAL NOT NULL,
            pod_namespace TEXT NOT NULL DEFAULT '',
            pod_name TEXT NOT NULL DEFAULT '',
            UNIQUE (container_id, ifname)
        );
        CREATE TABLE cooling (ip TEXT PRIMARY KEY, released_at REAL NOT NULL)
    """,
    2: """
        CREATE TABLE prefixes (cidr TEXT PRIMARY KEY, claimed_at REAL NOT NULL)
    """,
    3: """
        ALTER TABLE allocations ADD COLUMN allocated_boot REAL NOT NULL DEFAULT 0;
        ALTER TABLE allocations ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
        ALTER TABLE cooling ADD COLUMN released_boot REAL NOT NULL DEFAULT 0;
        ALTER TABLE cooling ADD COLUMN boot_id TEXT NOT NULL DEFAULT ''
    """,
}
ALLOCATION_COLUMNS = (
    "ip, container_id, ifname, allocated_at, allocated_boot, boot_id, pod_namespace, pod_name"
)


class AllocationRow(NamedTuple):
    ip: str
    container_id: str
    ifname: str
    allocated: Instant
    pod_namespace: str
    pod_name: str

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> AllocationRow:
        ip, cid, ifname, wall, boot, boot_id, namespace, name = row
        return cls(ip, cid, ifname, Instant(wall, boot, boot_id), namespace, name)


def store_path(state_dir: str, network: str) -> str:
    return os.path.join(state_dir, "ipam", f"{network}.db")


def store_networks(state_dir: str) -> list[str]:
    """Networks with a store under ``state_dir``."""
    directory = os.path.join(state_dir, "ipam")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(name.removesuffix(".db") for name in names if name.endswith(".db"))


def open_database(path: str, threads: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode; transactions are explicit (BEGIN IMMEDIATE).
    With ``threads``, any thread may use it (the caller serialises them)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=not threads
    )
    _use_wal(db)
    db.execute("PRAGMA synchronous=FULL")
    keep_wal_between_processes(db, path)
    return db


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch a new database to WAL (the mode persists in the file).

    The switch needs an exclusive lock, and SQLite does not wait for it the
    way it waits for a write lock, so processes creating the same database at
    once retry here.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


_writers_guard = threading.Lock()
_writers: dict[str, threading.Lock] = {}


def _writer_lock(path: str) -> threading.Lock:
    with _writers_guard:
        return _writers.setdefault(path, threading.Lock())


@contextmanager
def write_transaction(db: sqlite3.Connection, path: str) -> Iterator[sqlite3.Connection]:
    """An exclusive write transaction, committed on success, rolled back otherwise.

    Threads of one process (the agent's concurrent calls) queue on a lock first:
    SQLite's busy handler polls with sleeps growing to 100 ms, so in a burst a
    writer would sleep long after the lock was free. Other processes still meet
    on the database's own lock."""
    with _writer_lock(path):
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            raise StoreError(f'failed to lock "{path}": {err}') from None
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except sqlite3.Error as err:
            raise StoreError(f'failed to commit to "{path}": {err}') from None


class Store:
    def __init__(self, path: str, network: str, threads: bool = False) -> None:
        self.path = path
        try:
            self.db = open_database(path, threads)
            self._migrate(network)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f'failed to open IPAM store "{path}": {err}') from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, network: str) -> None:
        if self._version() == SCHEMA_VERSION:
            return
        if self._version() > SCHEMA_VERSION:
            raise StoreError(
                f'IPAM store "{self.path}" has format {self._version()}, newer than this '
                f"sluice understands ({SCHEMA_VERSION})",
            )
        with self.transaction():
            for version in range(self._version() + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version].split(";"):
                    self.db.execute(statement)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('network', ?)", (network,))
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.db, f"IPAM store {self.path}")

    # -- reads (inside or outside a transaction) ------------------------------

    def allocations(self) -> list[AllocationRow]:
        rows = self.db.execute(f"SELECT {ALLOCATION_COLUMNS} FROM allocations").fetchall()
        return [AllocationRow.from_row(row) for row in rows]

    def allocation_for(self, container_id: str, ifname: str) -> AllocationRow | None:
        row = self.db.execute(
            f"SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE container_id = ? AND ifname = ?",
            (container_id, ifname),
        ).fetchone()
        return AllocationRow.from_row(row) if row else None

    def allocated_ips(self) -> set[str]:
        return {ip for (ip,) in self.db.execute("SELECT ip FROM allocations")}

    def cooling_ips(self) -> set[str]:
        return {ip for (ip,) in self.db.execute("SELECT ip FROM cooling")}

    def cooling(self) -> dict[str, Instant]:
        """Released addresses not yet forgotten, with the instant of their release."""
        rows = self.db.execute("SELECT ip, released_at, released_boot, boot_id FROM cooling")
        return {ip: Instant(wall, boot, boot_id) for ip, wall, boot, boot_id in rows}

    def prefixes(self) -> dict[str, float]:
        """Blocks held in prefix mode, with the time each was claimed."""
        return dict(self.db.execute("SELECT cidr, claimed_at FROM prefixes").fetchall())

    def config(self) -> dict[str, Any] | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
        return json.loads(row[0]) if row else None

    # -- writes (inside a transaction) ----------------------------------------

    def insert_allocation(self, row: AllocationRow) -> None:
        self.db.execute(
            f"INSERT INTO allocations ({ALLOCATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.ip,
                row.container_id,
                row.ifname,
                row.allocated.wall,
                row.allocated.boot,
                row.allocated.boot_id,
                row.pod_namespace,
                row.pod_name,
            ),
        )
        self.db.execute("DELETE FROM cooling WHERE ip = ?", (row.ip,))

    def release(self, row: AllocationRow, released: Instant) -> None:
        self.db.execute(
            "DELETE FROM allocations WHERE ip = ? AND container_id = ? AND ifname = ?",
            (row.ip, row.container_id, row.ifname),
        )
        self.db.execute(
            "INSERT OR REPLACE INTO cooling (ip, released_at, released_boot, boot_id) "
            "VALUES (?, ?, ?, ?)",
            (row.ip, released.wall, released.boot, released.boot_id),
        )

    def forget_cooled(self, now: Instant, cooldown: float) -> None:
        """Forget addresses whose cooldown is over at ``now``: ``Instant.since`` in SQL
        (time since boot within one boot, the wall clock across boots), so that an
        allocation does not read every cooling address into Python."""
        self.db.execute(
            "DELETE FROM cooling WHERE CASE WHEN boot_id != '' AND boot_id = ? "
            "THEN ? - released_boot >= ? ELSE ? - released_at >= ? END",
            (now.boot_id, now.boot, cooldown, now.wall, cooldown),
        )

    def add_prefix(self, cidr: str, claimed_at: float) -> None:
        self.db.execute("INSERT OR IGNORE INTO prefixes VALUES (?, ?)", (cidr, claimed_at))

    def remove_prefix(self, cidr: str) -> None:
        self.db.execute("DELETE FROM prefixes WHERE cidr = ?", (cidr,))

    def save_config(self, config: dict[str, Any]) -> None:
        """Remember the IPAM configuration (written only when it changed)."""
        if self.config() != config:
            with self.transaction():
                self.db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('config', ?)", (json.dumps(config),)
                )
