"""Helpers for the IPAM tests: configurations, allocators, what they hold."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from ipam import config as ipam_config
from ipam.allocator import Allocator
from ipam.modes import open_allocator
from ipam.prefix import PrefixAllocator
from tests.harness.clock import SimulatedClock


def make_config(
    tmp_path: Path, subnet: str = "10.9.0.0/24", **ipam: object
) -> ipam_config.NodeCIDRConfig:
    config = ipam_config.from_plugin(
        "net1",
        {"stateDir": str(tmp_path), "ipam": {"type": "sluice-ipam", "subnet": subnet, **ipam}},
    )
    assert isinstance(config, ipam_config.NodeCIDRConfig)
    return config


def ips(allocator: Allocator) -> list[str]:
    return sorted((str(a.ip) for a in allocator.allocations()), key=ipaddress.IPv4Address)


def prefix_plugin(
    tmp_path: Path, node: str = "node-a", pool: str = "10.30.0.0/24", **ipam: object
) -> dict[str, Any]:
    return {
        "stateDir": str(tmp_path / node),
        "ipam": {
            "type": "sluice-ipam",
            "mode": "prefix",
            "pool": pool,
            "claimsDir": str(tmp_path / "claims"),
            "nodeName": node,
            **ipam,
        },
    }


def open_prefix(
    tmp_path: Path, clock: SimulatedClock | None = None, **kwargs: Any
) -> PrefixAllocator:
    config = ipam_config.from_plugin("net1", prefix_plugin(tmp_path, **kwargs))
    allocator = open_allocator(config, clock or SimulatedClock())
    assert isinstance(allocator, PrefixAllocator)
    return allocator


def held(allocator: PrefixAllocator) -> list[str]:
    return sorted(allocator.store.prefixes(), key=ipaddress.IPv4Network)
