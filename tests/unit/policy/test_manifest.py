"""Manifests: multi-document YAML, JSON and Lists, with errors that point at the document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni.policy.errors import PolicyInputError
from cni.policy.manifest import load_manifest, load_manifest_file
from cni.policy.model import Namespace, NetworkPolicy, Pod, Service

MANIFEST = """
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
# a comment-only document in between is skipped
---
apiVersion: v1
kind: Pod
metadata: {name: cart-0, namespace: shop, labels: {app: cart}}
spec: {nodeName: node-1, containers: [{name: cart}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: shop}
spec: {podSelector: {}}
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec: {clusterIP: 10.96.3.4, selector: {app: cart}, ports: [{port: 80}]}
"""


def test_multi_document_yaml() -> None:
    objects = load_manifest(MANIFEST)
    assert [type(o) for o in objects] == [Namespace, Pod, NetworkPolicy, Service]
    namespace = objects[0]
    assert isinstance(namespace, Namespace)
    assert dict(namespace.labels) == {"kubernetes.io/metadata.name": "shop"}
    pod = objects[1]
    assert isinstance(pod, Pod) and pod.ips == ()  # a local pod: the agent addresses it


def test_list_and_json() -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "a"},
                "status": {"podIP": "10.0.0.1"},
            },
        ],
    }
    from_json = load_manifest(json.dumps(listing, indent="\t"))
    from_yaml = load_manifest(
        b"kind: List\nitems:\n"
        + b"".join(f"  - {json.dumps(item)}\n".encode() for item in listing["items"])
    )
    assert from_json == from_yaml
    assert [type(o) for o in from_json] == [Namespace, Pod]


def test_unknown_kind_names_the_document() -> None:
    text = MANIFEST + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
    with pytest.raises(PolicyInputError) as caught:
        load_manifest(text)
    assert str(caught.value) == (
        'document 6: kind "Deployment" is not one of Namespace, Pod, NetworkPolicy, Service, List'
    )


def test_errors_inside_a_list_name_document_and_item() -> None:
    text = """
kind: Namespace
metadata: {name: x}
---
kind: List
items:
  - {kind: Namespace, metadata: {name: y}}
  - kind: NetworkPolicy
    metadata: {name: bad, namespace: x}
    spec: {podSelector: {}, ingress: [{ports: [{port: 80, endPort: 79}]}]}
"""
    with pytest.raises(PolicyInputError) as caught:
        load_manifest(text)
    assert str(caught.value) == (
        "document 2, item 1: NetworkPolicy x/bad: spec.ingress[0].ports[0].endPort 79 "
        "is lower than port 80"
    )


def test_invalid_yaml_and_non_objects() -> None:
    with pytest.raises(PolicyInputError, match="is not valid YAML or JSON"):
        load_manifest("kind: Pod\n  metadata: [")
    with pytest.raises(PolicyInputError, match=r'^document 1: "just text" must be an object'):
        load_manifest("just text")


def test_file(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST)
    assert load_manifest_file(path) == load_manifest(MANIFEST)
