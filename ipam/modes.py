"""Opening a network's allocator: the mode its configuration names, on its store."""

from __future__ import annotations

from ipam.allocator import Allocator
from ipam.clock import Clock, SystemClock
from ipam.config import NodeCIDRConfig, PrefixConfig
from ipam.nodecidr import NodeCIDRAllocator
from ipam.store import Store, store_path


def open_allocator(
    config: NodeCIDRConfig | PrefixConfig, clock: Clock | None = None, *, threads: bool = False
) -> Allocator:
    """The allocator for ``config``; close it (or use ``with``) when done. With
    ``threads``, any thread may use it, one at a time."""
    clock = clock or SystemClock()
    store = Store(store_path(config.state_dir, config.network), config.network, threads=threads)
    try:
        if isinstance(config, PrefixConfig):
            # Only here: prefix mode brings the claim store, which node-CIDR mode never needs.
            from ipam.prefix import PrefixAllocator

            return PrefixAllocator(config, store, clock)
        return NodeCIDRAllocator(config, store, clock)
    except BaseException:
        store.close()
        raise
