"""What ``sluicectl ipam show`` prints: pools, prefixes, allocations, fragmentation.

The JSON form is a stable schema (documented in docs/ipam.md):

    {"networks": [{"name", "mode", "subnet" | "pool", "prefixLength",
                   "allocations": [{"containerID", "ifname", "ip", "allocatedAt", ...}],
                   "prefixes": [{"cidr", "used", "cooling", "free"}],
                   "cooling": [{"ip", "releasedAt"}],
                   "stats": {"allocated", "free", "freeAlignedBlocks", "largestFreeBlock",
                             "prefixesHeld", "prefixesMinimum", "packing"}}]}

In prefix mode also ``claimStore`` ("local" or "kubernetes"), ``claims`` (every
claim of the pool: {"cidr", "node", "network", "used", "releasedAt"}) and the
stat ``largestFreeAddressBlock`` (the largest aligned network of free addresses
anywhere in the pool, inside claimed blocks included).

Numbers are recomputed from the store on every call, so they cannot drift.
"""

from __future__ import annotations

import ipaddress
import math
from datetime import UTC, datetime
from typing import Any

from ipam.allocator import Allocator
from ipam.clock import Instant
from ipam.nodecidr import NodeCIDRAllocator
from ipam.prefix import PrefixAllocator
from ipam.space import aligned_blocks, largest, unclaimed_space

Network = ipaddress.IPv4Network
NODE_CIDR_BLOCK = 28  # the block size fragmentation is measured in, in node-CIDR mode


def timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def network_report(allocator: Allocator) -> dict[str, Any]:
    allocations = sorted(allocator.allocations(), key=lambda a: a.ip)
    cooling = allocator.cooling()
    report: dict[str, Any] = {
        "name": allocator.config.network,
        "mode": allocator.config.to_json()["mode"],
        "allocations": [
            {
                "containerID": a.container_id,
                "ifname": a.ifname,
                "ip": str(a.ip),
                "allocatedAt": timestamp(a.allocated.wall),
                "podNamespace": a.pod_namespace,
                "podName": a.pod_name,
            }
            for a in allocations
        ],
        "cooling": [
            {"ip": ip, "releasedAt": timestamp(released.wall)}
            for ip, released in sorted(
                cooling.items(), key=lambda item: ipaddress.IPv4Address(item[0])
            )
        ],
    }
    if isinstance(allocator, PrefixAllocator):
        report.update(_prefix_part(allocator, len(allocations)))
    elif isinstance(allocator, NodeCIDRAllocator):
        report.update(_node_cidr_part(allocator, len(allocations), cooling))
    return report


def _node_cidr_part(
    allocator: NodeCIDRAllocator, allocated: int, cooling: dict[str, Instant]
) -> dict[str, Any]:
    busy = {str(a.ip) for a in allocator.allocations()} | set(cooling)
    free = [ip for ip in allocator.candidates() if str(ip) not in busy]
    space = list(ipaddress.collapse_addresses(ipaddress.IPv4Network(ip) for ip in free))
    return {
        "subnet": str(allocator.config.subnet),
        "prefixLength": None,
        "prefixes": [],
        "stats": {
            "allocated": allocated,
            "free": len(free),
            "freeAlignedBlocks": aligned_blocks(space, NODE_CIDR_BLOCK),
            "largestFreeBlock": largest(space),
            "prefixesHeld": None,
            "prefixesMinimum": None,
            "packing": None,
        },
    }


def _prefix_part(allocator: PrefixAllocator, allocated: int) -> dict[str, Any]:
    config = allocator.config
    held = sorted(ipaddress.IPv4Network(c) for c in allocator.store.prefixes())
    taken = [a.ip for a in allocator.allocations()]
    cooling = [ipaddress.IPv4Address(ip) for ip in allocator.cooling()]
    prefixes = []
    for block in held:
        used = sum(1 for ip in taken if ip in block)
        cool = sum(1 for ip in cooling if ip in block)
        prefixes.append(
            {
                "cidr": str(block),
                "used": used,
                "cooling": cool,
                "free": block.num_addresses - used - cool,
            }
        )
    claims = sorted(allocator.claims.claims(), key=lambda c: int(c.block.network_address))
    space = unclaimed_space(config.pool, config.prefix_length, [c.block for c in claims])
    minimum = math.ceil(allocated / config.block_size)
    return {
        "pool": str(config.pool),
        "prefixLength": config.prefix_length,
        "node": config.node_name,
        "claimStore": config.claim_store,
        "prefixes": prefixes,
        "claims": [
            {
                "cidr": str(c.block),
                "node": c.node,
                "network": c.network,
                "used": c.used,
                "releasedAt": timestamp(c.released_at) if c.released_at is not None else None,
            }
            for c in claims
        ],
        "stats": {
            "allocated": allocated,
            "free": allocator.pool_free(),
            "freeAlignedBlocks": aligned_blocks(space, config.prefix_length),
            "largestFreeBlock": largest(space),
            "largestFreeAddressBlock": largest(allocator.free_space()),
            "prefixesHeld": len(held),
            "prefixesMinimum": minimum,
            "packing": round(len(held) / minimum, 3) if minimum else None,
        },
    }
