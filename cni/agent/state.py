"""What the agent must remember across restarts: its endpoints and the objects
applied to its local manifest store.

One SQLite database per network, ``<stateDir>/agent/<network>.db``, written in
the same transaction-per-change way as the IPAM store. Applied objects are
fsynced at each commit: a policy must survive a power cut. Endpoint records
are not (``synchronous=NORMAL``: a commit survives the agent's crash, which
is what they are for, but maybe not the node's): they only matter while
their veth exists, and after the node restarts no veth or pinned map does.
That keeps an fsync off every ADD and DEL. Everything else the agent knows is
derived (policies are recomputed, the datapath is pinned in bpffs and keeps
enforcing while the agent is away).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ipam.store import open_database, write_transaction

SCHEMA = """
    CREATE TABLE IF NOT EXISTS endpoints (
        container_id TEXT NOT NULL,
        ifname TEXT NOT NULL,
        ifindex INTEGER NOT NULL,
        ips TEXT NOT NULL,
        pod_namespace TEXT NOT NULL,
        pod_name TEXT NOT NULL,
        PRIMARY KEY (container_id, ifname)
    );
    CREATE TABLE IF NOT EXISTS objects (
        kind TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (kind, namespace, name)
    )
"""


@dataclass(frozen=True)
class EndpointRecord:
    container_id: str
    ifname: str
    ifindex: int
    ips: tuple[str, ...]
    pod_namespace: str
    pod_name: str

    @property
    def key(self) -> tuple[str, str]:
        return self.container_id, self.ifname

    @property
    def pod(self) -> tuple[str, str] | None:
        """The pod it serves, when the runtime named one (CNI_ARGS K8S_POD_*)."""
        return (self.pod_namespace, self.pod_name) if self.pod_name else None


class AgentState:
    def __init__(self, state_dir: str, network: str) -> None:
        self.path = os.path.join(state_dir, "agent", f"{network}.db")
        self.db = open_database(self.path, threads=True)
        self.lock = threading.Lock()  # the agent's threads take turns on the connection
        with self._transaction():
            for statement in SCHEMA.split(";"):
                self.db.execute(statement)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[None]:
        with self.lock:
            # Set outside the transaction, under the lock every writer holds.
            self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            with write_transaction(self.db, f"agent state {self.path}"):
                yield

    # -- endpoints ---------------------------------------------------------------

    def endpoints(self) -> list[EndpointRecord]:
        with self.lock:
            rows = self.db.execute(
                "SELECT container_id, ifname, ifindex, ips, pod_namespace, pod_name FROM endpoints"
            ).fetchall()
        return [
            EndpointRecord(c, i, x, tuple(json.loads(ips)), ns, n) for c, i, x, ips, ns, n in rows
        ]

    def put_endpoint(self, record: EndpointRecord) -> None:
        with self._transaction(durable=False):
            self.db.execute(
                "INSERT OR REPLACE INTO endpoints VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.container_id,
                    record.ifname,
                    record.ifindex,
                    json.dumps(list(record.ips)),
                    record.pod_namespace,
                    record.pod_name,
                ),
            )

    def remove_endpoint(self, key: tuple[str, str]) -> None:
        with self._transaction(durable=False):
            self.db.execute("DELETE FROM endpoints WHERE container_id = ? AND ifname = ?", key)

    # -- the local manifest store -------------------------------------------------

    def objects(self) -> list[tuple[tuple[str, str, str], str]]:
        """Every stored object as it was applied: ((kind, namespace, name), its JSON
        text), left undecoded so that one unreadable row costs only itself."""
        with self.lock:
            rows = self.db.execute(
                "SELECT kind, namespace, name, body FROM objects ORDER BY kind, namespace, name"
            ).fetchall()
        return [((kind, namespace, name), body) for kind, namespace, name, body in rows]

    def change_objects(
        self, put: list[tuple[str, str, str, dict[str, Any]]], remove: list[tuple[str, str, str]]
    ) -> None:
        """Store and remove objects, keyed (kind, namespace, name), in one transaction."""
        with self._transaction():
            self.db.executemany(
                "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)",
                [(k, ns, n, json.dumps(body)) for k, ns, n, body in put],
            )
            self.db.executemany(
                "DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", remove
            )
