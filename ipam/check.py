"""Finding (and repairing) leaks and inconsistencies in a network's addresses.

Two kinds of checks:

- the store alone: an address or an attachment held twice, an address
  outside the range (node-CIDR) or outside every block the node holds, a
  block held without this node's claim (prefix mode);
- the store against the attachments present on the node, which the caller
  lists (the IPAM knows nothing of veths): an allocation without its
  attachment (a leak), an attachment without an allocation, an address
  routed elsewhere than its attachment.

Attachments are listed and repaired while the store's write lock is held, so
no ADD can allocate in between: an ADD commits its allocation before it
creates its veth, so under the lock every attachment of an ADD in flight
already has its allocation, and a veth without one is really orphaned. An
allocation without its attachment may still be an ADD between those two
steps, so it is released only once it is older than ``LEAK_GRACE_SECONDS``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ipam.allocator import Allocator
from ipam.nodecidr import NodeCIDRAllocator
from ipam.prefix import PrefixAllocator

LEAK_GRACE_SECONDS = 60.0

Attachment = tuple[str, str]  # (container id, ifname)


@dataclass
class Finding:
    kind: str
    detail: str
    repaired: bool = False


def check_store(allocator: Allocator) -> list[Finding]:
    """Duplicates and addresses outside what this node may hand out."""
    findings = []
    db = allocator.store.db
    for ip, count in db.execute(
        "SELECT ip, COUNT(*) FROM allocations GROUP BY ip HAVING COUNT(*) > 1"
    ):
        findings.append(Finding("duplicate-address", f"{ip} is allocated {count} times"))
    for cid, ifname, count in db.execute(
        "SELECT container_id, ifname, COUNT(*) FROM allocations "
        "GROUP BY container_id, ifname HAVING COUNT(*) > 1"
    ):
        findings.append(Finding("duplicate-attachment", f"{cid}/{ifname} holds {count} addresses"))
    if isinstance(allocator, PrefixAllocator):
        findings += _prefix_findings(allocator)
    elif isinstance(allocator, NodeCIDRAllocator):
        findings += [
            Finding("outside-range", f"{a.ip} ({a.container_id}) is outside the configured range")
            for a in allocator.allocations()
            if not allocator.in_range(a.ip)
        ]
    return findings


def _prefix_findings(allocator: PrefixAllocator) -> list[Finding]:
    findings = []
    held = [ipaddress.IPv4Network(c) for c in allocator.store.prefixes()]
    owners = {c.block: (c.node, c.network) for c in allocator.claims.claims()}
    me = (allocator.config.node_name, allocator.config.network)
    for block in held:
        owner = owners.get(block)
        if owner != me:
            detail = f"by {owner[0]}/{owner[1]}" if owner else "by nobody"
            findings.append(Finding("block-not-claimed", f"{block} is held but claimed {detail}"))
    for a in allocator.allocations():
        if not any(a.ip in block for block in held):
            findings.append(
                Finding(
                    "outside-range", f"{a.ip} ({a.container_id}) is in no block this node holds"
                )
            )
    return findings


def check_attachments(
    allocator: Allocator,
    list_attachments: Callable[[], Mapping[Attachment, Sequence[str]]],
    repair: bool,
    remove_attachment: Callable[[str, str], None],
) -> list[Finding]:
    """Allocations against the node's attachments ({(container id, ifname): routed
    addresses}); with ``repair``, release leaked allocations and remove orphaned
    attachments through ``remove_attachment``."""
    findings = []
    with allocator.changing():
        present = list_attachments()
        rows = {(r.container_id, r.ifname): r for r in allocator.store.allocations()}
        now = allocator.clock.now()
        leaked = []
        for key, row in sorted(rows.items()):
            if key in present:
                if row.ip not in present[key]:
                    findings.append(
                        Finding(
                            "route-mismatch",
                            f"{row.ip} of {key[0]}/{key[1]} is not routed to its attachment "
                            f"({list(present[key])})",
                        )
                    )
                continue
            finding = Finding("allocation-without-veth", f"{row.ip} held by {key[0]}/{key[1]}")
            if repair and now.since(row.allocated) > LEAK_GRACE_SECONDS:
                leaked.append(row)
                finding.repaired = True
            findings.append(finding)
        for key in sorted(set(present) - set(rows)):
            finding = Finding("veth-without-allocation", f"attachment {key[0]}/{key[1]}")
            if repair:
                remove_attachment(*key)
                finding.repaired = True
            findings.append(finding)
        allocator.release_rows(leaked)
    return findings
