"""Free address space as aligned networks: what is unclaimed in a pool, what is free
inside a block, and the largest aligned free network of either.

A pool is fragmented when it still has free addresses but no free aligned block of
the claim size; the largest aligned free network tells how far it is from one
(lesson 16 of the IPAM notes: nobody else exports it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network


def aligned_blocks(space: Iterable[Network], prefix_length: int) -> int:
    """How many aligned /prefix_length blocks fit entirely in ``space``."""
    return sum(
        2 ** (prefix_length - net.prefixlen) for net in space if net.prefixlen <= prefix_length
    )


def largest_network(space: Iterable[Network]) -> Network | None:
    """The largest network of ``space`` (ties: the lowest), or None when it is empty."""
    return min(space, key=lambda n: (n.prefixlen, int(n.network_address)), default=None)


def largest(space: Iterable[Network]) -> str | None:
    found = largest_network(space)
    return str(found) if found is not None else None


def runs(values: Iterable[int]) -> list[Network]:
    """Integer addresses as the fewest aligned networks covering exactly them."""
    networks: list[Network] = []
    ordered = sorted(set(values))
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ipaddress.IPv4Address(ordered[start]), ipaddress.IPv4Address(ordered[end])
        networks.extend(ipaddress.summarize_address_range(first, last))
        start = end + 1
    return networks


def free_in_block(block: Network, busy: Iterable[ipaddress.IPv4Address]) -> tuple[Network, ...]:
    """The addresses of ``block`` not in ``busy``, as aligned networks."""
    low, high = int(block.network_address), int(block.broadcast_address)
    taken = {int(ip) for ip in busy if low <= int(ip) <= high}
    return tuple(runs(v for v in range(low, high + 1) if v not in taken))


def unclaimed_space(pool: Network, prefix_length: int, claimed: Iterable[Network]) -> list[Network]:
    """The pool minus the claimed networks, rounded inward to whole aligned blocks
    (a block that overlaps any claim is not free), as the largest aligned networks."""
    size = 2 ** (32 - prefix_length)
    low, end = int(pool.network_address), int(pool.broadcast_address) + 1
    taken = sorted(
        (int(c.network_address), int(c.broadcast_address) + 1) for c in claimed if c.overlaps(pool)
    )
    space: list[Network] = []

    def add(start: int, stop: int) -> None:  # [start, stop) in whole blocks
        start, stop = -(-start // size) * size, stop // size * size
        if start < stop:
            first, last = ipaddress.IPv4Address(start), ipaddress.IPv4Address(stop - 1)
            space.extend(ipaddress.summarize_address_range(first, last))

    cursor = low
    for start, stop in taken:
        if start > cursor:
            add(cursor, start)
        cursor = max(cursor, stop)
    add(cursor, end)
    return space
