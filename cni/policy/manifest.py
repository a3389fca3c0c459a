"""Manifests as ``sluicectl apply -f`` takes them: multi-document YAML, or JSON.

A document is a Namespace, Pod, NetworkPolicy or Service, or a ``kind: List``
whose ``items`` are. Empty documents are skipped. Errors name the document
(counted from 1, in file order) and, in a List, the item (from 0):
``document 2, item 0: NetworkPolicy x/deny: spec.podSelector ...``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from cni.policy.errors import MISSING, PolicyInputError
from cni.policy.model import KubeObject
from cni.policy.parse import PARSERS

try:  # libyaml's loader is about ten times faster
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - pyyaml built without libyaml
    _Loader = yaml.SafeLoader


def _documents(text: str) -> Iterator[Any]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            yield json.loads(text)
            return
        except json.JSONDecodeError:
            pass  # YAML flow style looks the same; let YAML read it
    try:
        yield from yaml.load_all(text, Loader=_Loader)
    except yaml.YAMLError as err:
        raise PolicyInputError(
            "manifest", "", MISSING, f"is not valid YAML or JSON: {err}"
        ) from None


def _parse(doc: object, where: str) -> KubeObject:
    if not isinstance(doc, Mapping):
        raise PolicyInputError(where, "", doc, "must be an object with a kind")
    kind = doc.get("kind")
    if kind not in PARSERS:
        raise PolicyInputError(
            where,
            "kind",
            MISSING if kind is None else kind,
            "is not one of " + ", ".join([*PARSERS, "List"]),
        )
    try:
        return PARSERS[kind](doc)
    except PolicyInputError as err:
        raise err.within(where) from None


def load_manifest(text: str | bytes) -> list[KubeObject]:
    """Every object of a manifest, in order."""
    return [obj for _, obj in load_manifest_documents(text)]


def load_manifest_documents(text: str | bytes) -> list[tuple[dict[str, Any], KubeObject]]:
    """Every object of a manifest with the document it was read from (to store it)."""
    if isinstance(text, bytes):
        text = text.decode()
    found: list[tuple[dict[str, Any], KubeObject]] = []
    for number, doc in enumerate(_documents(text), start=1):
        if doc is None:
            continue
        where = f"document {number}"
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise PolicyInputError(where, "items", items, "must be a list")
            for i, item in enumerate(items):
                obj = _parse(item, f"{where}, item {i}")
                found.append((dict(item), obj))
        else:
            obj = _parse(doc, where)
            found.append((dict(doc), obj))
    return found


def load_manifest_file(path: str | Path) -> list[KubeObject]:
    """``load_manifest`` of a file; "-" is not special here (the CLI reads stdin itself)."""
    return load_manifest(Path(path).read_text())
