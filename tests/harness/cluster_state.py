"""What the test clusters record about themselves, so that ``down`` undoes ``up``.

``ClusterState`` is the single-node ``Cluster``'s ``<dir>/state.json``;
``MultiNodeState`` (with a ``NodeState`` per node) is ``MultiNodeCluster``'s
``<run dir>/<name>-nodes/state.json``. Each grows as ``up`` goes and is rewritten
before every step, so a later process (after a crash) finds everything to remove.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.harness import host
from tests.harness.processes import ProcessRecord

State = TypeVar("State")


class ClusterError(RuntimeError):
    pass


def records_to_json(records: dict[str, ProcessRecord]) -> dict[str, Any]:
    return {k: v.to_json() for k, v in records.items()}


def records_from_json(data: dict[str, Any]) -> dict[str, ProcessRecord]:
    return {k: ProcessRecord.from_json(v) for k, v in data.items()}


@dataclass
class ClusterState:
    """What ``down`` needs to undo ``up``, written to ``<dir>/state.json`` as it grows."""

    name: str
    directory: str
    node_name: str
    node_ip: str
    port_base: int
    pod_cidr: str
    network: str
    bpf_dir: str
    cgroup_root: str
    containerd_base: str
    host: host.HostSnapshot
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    control_plane_only: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["host"] = self.host.to_json()
        data["processes"] = records_to_json(self.processes)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        # Tolerate keys written by other versions of this harness.
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["host"] = host.HostSnapshot.from_json(data["host"])
        data["processes"] = records_from_json(data.get("processes", {}))
        return cls(**data)


@dataclass
class NodeState:
    index: int
    name: str  # the Node object's name
    netns: str
    address: str
    directory: str
    bpf_dir: str
    cgroup_root: str
    pod_cidr: str = ""
    processes: dict[str, ProcessRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = records_to_json(self.processes)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["processes"] = records_from_json(data.get("processes", {}))
        return cls(**data)


@dataclass
class MultiNodeState:
    name: str
    prefix: str
    subnet: str
    routes: str
    cni: str
    resolver: str
    host: host.HostSnapshot
    nodes: list[NodeState] = field(default_factory=list)
    processes: dict[str, ProcessRecord] = field(default_factory=dict)  # on the host

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("name", "prefix", "subnet", "routes", "cni")},
            "resolver": self.resolver,
            "host": self.host.to_json(),
            "nodes": [n.to_json() for n in self.nodes],
            "processes": records_to_json(self.processes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MultiNodeState:
        return cls(
            name=data["name"],
            prefix=data["prefix"],
            subnet=data["subnet"],
            routes=data["routes"],
            cni=data.get("cni", "sluice"),
            resolver=data.get("resolver", "agent"),
            host=host.HostSnapshot.from_json(data["host"]),
            nodes=[NodeState.from_json(n) for n in data.get("nodes", [])],
            processes=records_from_json(data.get("processes", {})),
        )


def write_state(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` at once: a crash leaves the old state or the new, never half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def read_state(path: Path, parse: Callable[[dict[str, Any]], State]) -> State | None:
    """The state in ``path``, or None when there is none (the cluster is not up)."""
    try:
        return parse(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as exc:
        raise ClusterError(f"{path} is unreadable: {exc}") from exc
