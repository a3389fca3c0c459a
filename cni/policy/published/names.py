"""The controller's objects (group ``sluice.dev``, version ``v1alpha1``; CRDs in
``conf/policyendpoints.yaml``): their kinds and API paths, the objects' names and
labels, and the digests those are built from.

All three kinds are cluster-scoped: a Role, which is all a namespace's tenant can
be given, grants nothing on cluster-scoped kinds, so only a ClusterRole can let
anyone write them (``conf/sluice-rbac.yaml`` lets the controller alone; see
docs/security.md, Trust model).

- ``PolicyEndpoints`` (one per NetworkPolicy, named ``<namespace>.<name>``):
  the policy's namespace, name, uid and generation, its rules as the resolver
  reads them, and the names of the address sets that hold the pods its
  selectors pick. Labelled ``node.sluice.dev/<node>`` for every node that
  hosts a pod the policy selects. It has no owner reference: a cluster-scoped
  object cannot be owned by a namespaced one (the garbage collector never
  collects it and reports ``OwnerRefInvalidNamespace``); the controller
  deletes the PolicyEndpoints of a policy that is gone.
- ``AddressSet`` (cluster-scoped, sharded): the pods of one distinct selector
  group (name, addresses, named ports when a policy needs them), shared by
  every policy that has that selector. Labelled ``node.sluice.dev/<node>`` for
  every node that hosts a pod selected by a policy that reads the set.
- ``PolicyTargets`` (cluster-scoped, sharded, one set per node): every pod the
  controller knows on the node (name, uid) with the policies that select it.
  Labelled ``sluice.dev/node: <node>``.

Node names longer than a label allows (63) are shortened with a hash
(``node_label``); so are object names built from long policy names.

The objects' contents: ``render`` (written), ``shards`` (read back); what each
says about itself: ``identity``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cni.policy.model import PodKey
from cni.policy.published.sets import AddressSetKey
from cni.policy.render import group_json

GROUP = "sluice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
API_BASE = f"/apis/{GROUP}/{VERSION}"

POLICY_ENDPOINTS = "PolicyEndpoints"
ADDRESS_SET = "AddressSet"
POLICY_TARGETS = "PolicyTargets"
PLURALS = {
    POLICY_ENDPOINTS: "policyendpoints",
    ADDRESS_SET: "addresssets",
    POLICY_TARGETS: "policytargets",
}

NODE_LABEL_PREFIX = "node.sluice.dev/"  # + node: on sets a node needs
TARGETS_NODE_LABEL = "sluice.dev/node"  # = node: on a node's PolicyTargets
POLICY_LABEL = "sluice.dev/policy"  # = policy name, on PolicyEndpoints
ADDRESS_SET_LABEL = "sluice.dev/address-set"  # = set id, on AddressSets
MANAGED_BY = {"app.kubernetes.io/managed-by": "sluice-controller"}

LABEL_LIMIT = 63
NAME_LIMIT = 253


def _shortened(text: str, limit: int) -> str:
    """``text``, or its head and a hash of the whole when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[: limit - 17].rstrip('-.')}-{digest}"


def node_label(node: str) -> str:
    """A node name as a label name or value (node names may be longer than 63)."""
    return _shortened(node, LABEL_LIMIT)


def node_label_key(node: str) -> str:
    return NODE_LABEL_PREFIX + node_label(node)


def policy_label(policy: str) -> str:
    """A policy name as a label value (policy names may be longer than 63)."""
    return _shortened(policy, LABEL_LIMIT)


def collection_path(kind: str) -> str:
    return f"{API_BASE}/{PLURALS[kind]}"


def object_path(kind: str, name: str) -> str:
    return f"{collection_path(kind)}/{name}"


def spec_hash(spec: Mapping[str, Any]) -> str:
    """A digest of a spec's content, the same for what the controller writes and what
    the API server returns (it keeps a CRD's JSON as written, keys sorted)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pod_name(key: PodKey) -> str:
    return f"{key[0]}/{key[1]}"


# -- object names ----------------------------------------------------------------------


def address_set_id(key: AddressSetKey) -> str:
    """A stable name for an address set: a digest of what it holds."""
    described = {"group": group_json(key.group), "ports": key.ports}
    if key.only_named is not None:
        described["onlyNamedPorts"] = sorted(key.only_named)
    return "as-" + spec_hash(described)[:20]


def policy_endpoints_name(namespace: str, policy: str) -> str:
    """One object per policy: a namespace name has no dot, so the first one separates."""
    return _shortened(f"{namespace}.{policy}", NAME_LIMIT)


def address_set_name(set_id: str, index: int) -> str:
    return f"{set_id}-{index}"


def policy_targets_name(node: str, index: int) -> str:
    return f"{_shortened(node, NAME_LIMIT - 8)}-{index}"
