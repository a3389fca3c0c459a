"""Where the agent's objects come from. This module: the local manifest store, for
nodes without an API server (``sluicectl apply -f`` / ``delete -f``).

Applied documents are kept in the agent's state database as they were
written and fed to the enforcer; re-applying an object with the same kind,
namespace and name replaces it. The store syncs at start by loading what is
stored, so a restarted agent enforces what was applied before. A stored object
that no longer reads (a row damaged on disk, or a document an older version
accepted) is refused, logged and reported (``refused``, shown by ``sluicectl
status``); the others are served. A stored NetworkPolicy is read failing closed,
as one from the API is: what cannot be read of it isolates and allows nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from cni.agent.endpoint_installs import EndpointKey
from cni.agent.enforcer import Enforcer
from cni.agent.state import AgentState
from cni.policy.errors import PolicyInputError
from cni.policy.manifest import load_manifest_documents
from cni.policy.model import KubeObject, Namespace
from cni.policy.parse import parse_object
from cni.policy.parse_policy import read_network_policy

log = logging.getLogger("sluice.agent")


def object_key(obj: KubeObject) -> tuple[str, str, str]:
    if isinstance(obj, Namespace):
        return "Namespace", "", obj.name
    namespace, name = obj.key
    return type(obj).__name__, namespace, name


def describe(key: tuple[str, str, str]) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


class LocalStore:
    def __init__(self, state: AgentState, enforcer: Enforcer) -> None:
        self.state = state
        self.enforcer = enforcer
        # Stored objects that could not be read at start: what, and why.
        self.refused: dict[str, str] = {}

    def load(self) -> None:
        objects = []
        for key, text in self.state.objects():
            try:
                objects.append(_read_stored(text))
            except (ValueError, PolicyInputError) as err:
                self.refused[describe(key)] = str(err)
                log.error("local store: refused the stored %s: %s", describe(key), err)
        self.enforcer.change(objects, [])
        log.info("local store: %d objects, %d refused", len(objects), len(self.refused))

    def apply(self, text: str) -> tuple[list[str], set[EndpointKey]]:
        """Store and enforce the manifest's objects; (what was applied, endpoints affected).
        Raises PolicyInputError (nothing is stored) if any document is invalid."""
        documents = load_manifest_documents(text)
        put = [(*object_key(obj), _stored(body)) for body, obj in documents]
        self.state.change_objects(put, [])
        affected = self.enforcer.change([obj for _, obj in documents], [])
        return [describe(object_key(obj)) for _, obj in documents], affected

    def delete(self, text: str) -> tuple[list[str], set[EndpointKey]]:
        """Remove the manifest's objects (by kind, namespace and name)."""
        objects = [obj for _, obj in load_manifest_documents(text)]
        keys = [object_key(obj) for obj in objects]
        self.state.change_objects([], keys)
        affected = self.enforcer.change([], objects)
        return [describe(key) for key in keys], affected


def _read_stored(text: str) -> KubeObject:
    """A stored object as the resolver reads it; ValueError or PolicyInputError if not."""
    body = json.loads(text)
    if isinstance(body, dict) and body.get("kind") == "NetworkPolicy":
        return read_network_policy(body)  # fails closed, as from the API
    return parse_object(body)


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """What is kept of a document: everything but the server-side bookkeeping."""
    metadata = {
        k: v
        for k, v in (body.get("metadata") or {}).items()
        if k in ("name", "namespace", "labels")
    }
    return {**body, "metadata": metadata}
