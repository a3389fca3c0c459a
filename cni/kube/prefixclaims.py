"""The PrefixClaim object (``conf/prefixclaims.yaml``): one claimed block of a pool.

Readers other than the IPAM (the route keeper: one route per prefix a remote node
holds) rely on this format:

- cluster-scoped, ``sluice.dev/v1alpha1``, named after the block with ``/`` as
  ``-`` (``10.244.3.16/28`` is ``10.244.3.16-28``): the name is unique, so
  creating the object is the claim, and a create that finds it taken (409) means
  another node won;
- labels ``sluice.dev/node`` (the holder, so one node's claims are one label
  selector away) and ``sluice.dev/pool`` (``10.244.0.0-16``);
- ``spec``: ``prefix``, ``pool``, ``node``, ``network``, and ``releasedAt`` once
  the holder gave the block back (the object goes when the cooldown is over; until
  then nobody else can claim the block and the holder may take it back); a claim
  counts only if it is one block of the reader's pool (``ipam.claims.PoolBlocks``):
  ``pool`` that pool, ``prefix`` inside it and of its prefix length;
- an ownerReference to the Node, so that deleting the Node deletes its claims;
- ``status``: ``used`` and ``free`` (the free parts of the block as CIDRs), what
  the holder uses, published for the other nodes' figures.
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import Any

from ipam.claims import Block, BlockUsage, Claim

GROUP = "sluice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PrefixClaim"
PATH = f"/apis/{GROUP}/{VERSION}/prefixclaims"
NODE_LABEL = f"{GROUP}/node"
POOL_LABEL = f"{GROUP}/pool"


class ClaimFormatError(ValueError):
    """An object that is not a PrefixClaim this format describes."""


def name_of(block: Block) -> str:
    return f"{block.network_address}-{block.prefixlen}"


def label_of(network: Block) -> str:
    """A CIDR as a label value (``/`` is not allowed in one)."""
    return name_of(network)


def path_of(block: Block) -> str:
    return f"{PATH}/{name_of(block)}"


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch_of(text: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        raise ClaimFormatError(f"not an RFC 3339 time: {text!r}") from None


def claim_object(
    block: Block, pool: Block, node: str, node_uid: str, network: str
) -> dict[str, Any]:
    """The object that claims ``block`` for (node, network)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name_of(block),
            "labels": {NODE_LABEL: node, POOL_LABEL: label_of(pool)},
            # Not blockOwnerDeletion: that would need the update verb on nodes/finalizers,
            # and nothing needs the Node to wait for its claims.
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {"prefix": str(block), "pool": str(pool), "node": node, "network": network},
    }


def usage_status(usage: BlockUsage) -> dict[str, Any]:
    return {"status": {"used": usage.used, "free": [str(n) for n in usage.free]}}


def parse(obj: dict[str, Any]) -> Claim:
    """The claim an object states; ClaimFormatError when it states none. Whether it is
    a block of the reader's pool is the reader's question (``PoolBlocks.misfit``)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name = metadata.get("name")
    try:
        block = ipaddress.IPv4Network(spec.get("prefix"))
        free = status.get("free")
        free_parts = tuple(ipaddress.IPv4Network(n) for n in free) if free is not None else None
    except (TypeError, ValueError) as err:
        raise ClaimFormatError(f"PrefixClaim {name!r}: {err}") from None
    if name != name_of(block):
        raise ClaimFormatError(f"PrefixClaim {name!r} does not name its prefix {block}")
    node, network = spec.get("node"), spec.get("network")
    if not isinstance(node, str) or not isinstance(network, str):
        raise ClaimFormatError(f"PrefixClaim {name!r} has no node or network")
    used = status.get("used", 0)
    released = spec.get("releasedAt")
    created = metadata.get("creationTimestamp")
    return Claim(
        block,
        node,
        network,
        epoch_of(created) if created else 0.0,
        used if isinstance(used, int) else 0,
        free_parts,
        epoch_of(released) if released else None,
        _pool(spec.get("pool")),
    )


def _pool(text: Any) -> Block | None:
    """The pool a claim states, if it is written as the agents write one (and as the
    admission policy compares it): an IPv4 CIDR in its canonical form."""
    if not isinstance(text, str):
        return None
    try:
        pool = ipaddress.IPv4Network(text)
    except ValueError:
        return None
    return pool if str(pool) == text else None


def owner_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the Node the object is owned by."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Node" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid"))
    return None
