"""What the claim store's unit tests share: a network's config, PrefixClaim objects as
the API server returns them, and an API server of PrefixClaims in memory."""

from __future__ import annotations

import copy
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cni.kube import prefixclaims
from cni.kube.api import ApiError
from ipam import config as ipam_config
from ipam.claims import BlockUsage

Net = ipaddress.IPv4Network
POOL = Net("10.40.0.0/24")
NODE_PATH = "/api/v1/nodes/"


def config(tmp_path: Path, cooldown: float | None = None) -> ipam_config.PrefixConfig:
    ipam: dict[str, Any] = {
        "type": "sluice-ipam",
        "mode": "prefix",
        "pool": str(POOL),
        "claimStore": "kubernetes",
        "nodeName": "node-a",
    }
    if cooldown is not None:
        ipam["cooldownSeconds"] = cooldown
    parsed = ipam_config.from_plugin("net1", {"stateDir": str(tmp_path), "ipam": ipam})
    assert isinstance(parsed, ipam_config.PrefixConfig)
    return parsed


def claim_obj(
    block: str,
    node: str = "node-a",
    uid: str = "u1",
    generation: int = 1,
    released: str | None = None,
    used: int | None = None,
) -> dict[str, Any]:
    obj = prefixclaims.claim_object(Net(block), POOL, node, "node-uid", "net1")
    obj["metadata"].update(
        uid=uid,
        generation=generation,
        resourceVersion=str(generation),
        creationTimestamp="2026-12-01T10:00:00Z",
    )
    if released:
        obj["spec"]["releasedAt"] = released
    if used is not None:
        obj.update(prefixclaims.usage_status(BlockUsage(used, ())))
    return obj


class FakeApi:
    """PrefixClaims and Nodes as the API server keeps them: uids, resourceVersions,
    generations bumped by spec changes only, 409 on a taken name or a failed
    precondition, 404 on a missing object. ``fail`` makes the next request of a
    method fail with that error. A watch brings nothing and ends once ``closed`` is
    set (as closing the client ends it)."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.nodes = {"node-a": "node-uid"}
        self.requests: list[tuple[str, str]] = []
        self.lists: list[dict[str, str]] = []  # each list's parameters
        self.fail: dict[str, ApiError] = {}
        self.closed = threading.Event()
        self._version = 100
        self._uids = 0

    def _request(self, method: str, path: str) -> None:
        self.requests.append((method, path))
        error = self.fail.pop(method, None)
        if error is not None:
            raise error

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        return copy.deepcopy(obj)

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An object somebody else created."""
        obj = copy.deepcopy(obj)
        self._uids += 1
        obj["metadata"].update(uid=f"uid-{self._uids}", generation=1)
        self.claims[obj["metadata"]["name"]] = obj
        return self._bump(obj)

    def pages(self, path: str, **params: str) -> Iterator[tuple[list[dict[str, Any]], str]]:
        self._request("LIST", path)
        self.lists.append(params)
        yield [copy.deepcopy(obj) for obj in self.claims.values()], str(self._version)

    def watch(self, path: str, version: str, **params: str) -> Iterator[tuple[str, Any]]:
        self._request("WATCH", path)
        self.closed.wait(10)
        yield from ()

    def get(self, path: str) -> dict[str, Any] | None:
        self._request("GET", path)
        if path.startswith(NODE_PATH):
            uid = self.nodes.get(path.removeprefix(NODE_PATH))
            return None if uid is None else {"metadata": {"uid": uid}}
        found = self.claims.get(path.rsplit("/", 1)[1])
        return copy.deepcopy(found)

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._request("POST", path)
        if obj["metadata"]["name"] in self.claims:
            raise ApiError(409, "already exists")
        return self.add(obj)

    def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self._request("PATCH", path)
        name, status = path.removeprefix(prefixclaims.PATH + "/"), False
        if name.endswith("/status"):
            name, status = name.removesuffix("/status"), True
        obj = self.claims.get(name)
        if obj is None:
            raise ApiError(404, "not found")
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified")
        if status:
            obj["status"] = patch["status"]
        else:
            for key, value in patch.get("spec", {}).items():
                if value is None:
                    obj["spec"].pop(key, None)
                else:
                    obj["spec"][key] = value
            obj["metadata"]["generation"] += 1
        return self._bump(obj)

    def _json(self, method: str, path: str, json: dict[str, Any]) -> dict[str, Any]:
        assert method == "DELETE"
        self._request(method, path)
        name = path.rsplit("/", 1)[1]
        obj = self.claims.get(name)
        if obj is None:
            raise ApiError(404, "not found")
        wanted = json["preconditions"]
        if (wanted["uid"], wanted["resourceVersion"]) != (
            obj["metadata"]["uid"],
            obj["metadata"]["resourceVersion"],
        ):
            raise ApiError(409, "precondition failed")
        del self.claims[name]
        return {}
