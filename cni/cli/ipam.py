"""sluicectl ipam: show, garbage-collect and check a network's addresses."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import click

from cni import conflist as conflist_mod
from cni.conflist import DEFAULT_CONF
from cni.errors import CNIError
from ipam import config as ipam_config
from ipam.allocator import Allocator, open_allocator
from ipam.store import Store, store_networks, store_path

# An ADD allocates before it creates the veth; an allocation this young
# without a veth is probably an ADD in progress, not a leak.
LEAK_GRACE_SECONDS = 60.0


class Target:
    """A network's IPAM, found through its conflist or its store."""

    def __init__(self, plugin: dict[str, Any]) -> None:
        self.plugin = plugin
        self.config = ipam_config.parse(plugin["name"], plugin)

    @property
    def wires_veths(self) -> bool:
        """Only the sluice plugin creates node-side veths this IPAM can be checked against."""
        return self.plugin.get("type") == "sluice"

    def open(self) -> Allocator:
        return open_allocator(self.config)


def _fail(message: str) -> None:
    raise click.ClickException(message)


def targets_from(conf_path: str | None, state_dir: str | None) -> list[Target]:
    try:
        if state_dir:
            found = []
            for network in store_networks(state_dir):
                with Store(store_path(state_dir, network), network) as store:
                    snapshot = store.config()
                if snapshot:
                    found.append(Target({"name": network, "stateDir": state_dir, "ipam": snapshot}))
            return found
        return [Target(conflist_mod.load(conf_path or DEFAULT_CONF).ipam_plugin())]
    except (conflist_mod.ConflistError, CNIError) as err:
        _fail(str(err))
    return []


conf_option = click.option(
    "--conf", "conf_path", default=None, help=f"The network's conflist [default: {DEFAULT_CONF}]."
)


@click.group()
def ipam() -> None:
    """Addresses: show them, release stale ones, check for leaks and duplicates."""


@ipam.command()
@conf_option
@click.option("--state-dir", default=None, help="Show every network stored here instead.")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def show(conf_path: str | None, state_dir: str | None, output: str) -> None:
    """Pools, prefixes, allocations and fragmentation."""
    from ipam.report import network_report, render_table

    networks = []
    for target in targets_from(conf_path, state_dir):
        with target.open() as allocator:
            networks.append(network_report(allocator))
    report = {"networks": networks}
    click.echo(json.dumps(report, indent=2) if output == "json" else render_table(report))


def parse_valid(values: tuple[str, ...]) -> set[tuple[str, str]]:
    valid = set()
    for value in values:
        container_id, _, ifname = value.partition("/")
        valid.add((container_id, ifname or "eth0"))
    return valid


@ipam.command()
@conf_option
@click.option(
    "--valid",
    "valid",
    multiple=True,
    metavar="CONTAINERID[/IFNAME]",
    help="An attachment still in use (repeatable; IFNAME defaults to eth0).",
)
@click.option("--none-valid", is_flag=True, help="Release every attachment of the network.")
@click.option("--dry-run", is_flag=True, help="Only list what would be released.")
def gc(conf_path: str | None, valid: tuple[str, ...], none_valid: bool, dry_run: bool) -> None:
    """Release every attachment not listed with --valid, as CNI GC does.

    For a sluice network this runs the plugin's own GC, which also removes the
    attachments' veths and masquerade entries.
    """
    if not valid and not none_valid:
        _fail("name the attachments still in use with --valid, or pass --none-valid")
    keep = parse_valid(valid)
    (target,) = targets_from(conf_path, None)
    with target.open() as allocator:
        stale = [a for a in allocator.allocations() if (a.container_id, a.ifname) not in keep]
    for a in stale:
        click.echo(
            f"{'would release' if dry_run else 'release'} {a.ip} {a.container_id}/{a.ifname}"
        )
    if dry_run:
        return
    if target.wires_veths:
        _plugin_gc(target.plugin, keep)
    else:
        with target.open() as allocator:
            allocator.gc(keep)
    click.echo(f"released {len(stale)} attachment(s)")


def _plugin_gc(plugin: dict[str, Any], keep: set[tuple[str, str]]) -> None:
    from cni.protocol import Request
    from cni.verbs import gc as gc_verb

    config = {
        **plugin,
        "cni.dev/valid-attachments": [
            {"containerID": cid, "ifname": ifname} for cid, ifname in sorted(keep)
        ],
    }
    request = Request(
        command="GC",
        cni_version=plugin["cniVersion"],
        network=plugin["name"],
        config=config,
        raw_config=json.dumps(config).encode(),
        env={},
    )
    try:
        gc_verb.run(request)
    except CNIError as err:
        _fail(f"GC finished with errors: {err.details}")


@dataclass
class Finding:
    kind: str
    detail: str
    repaired: bool = False


@ipam.command()
@conf_option
@click.option("--repair", is_flag=True, help="Fix what is safe to fix.")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def check(conf_path: str | None, repair: bool, output: str) -> None:
    """Find leaked allocations, veths without an allocation, and duplicates (exit 1)."""
    (target,) = targets_from(conf_path, None)
    with target.open() as allocator:
        findings = store_findings(allocator)
        if target.wires_veths:
            findings += veth_findings(target, allocator, repair)
    if output == "json":
        report = {"network": target.config.network, "findings": [asdict(f) for f in findings]}
        click.echo(json.dumps(report, indent=2))
    else:
        for f in findings:
            click.echo(f"{f.kind:<22}{f.detail}{'  (repaired)' if f.repaired else ''}")
        if not findings:
            click.echo(f"network {target.config.network}: no problem found")
    raise SystemExit(1 if any(not f.repaired for f in findings) else 0)


def store_findings(allocator: Allocator) -> list[Finding]:
    """Duplicates and addresses outside what this node may hand out."""
    import ipaddress

    from ipam.nodecidr import NodeCIDRAllocator
    from ipam.prefix import PrefixAllocator

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
        held = [ipaddress.IPv4Network(c) for c in allocator.store.prefixes()]
        owners = {c.block: (c.node, c.network) for c in allocator.claims.claims()}
        me = (allocator.config.node_name, allocator.config.network)
        for block in held:
            if owners.get(block) != me:
                owner = owners.get(block)
                detail = f"by {owner[0]}/{owner[1]}" if owner else "by nobody"
                findings.append(
                    Finding("block-not-claimed", f"{block} is held but claimed {detail}")
                )
        for a in allocator.allocations():
            if not any(a.ip in block for block in held):
                findings.append(
                    Finding(
                        "outside-range", f"{a.ip} ({a.container_id}) is in no block this node holds"
                    )
                )
    elif isinstance(allocator, NodeCIDRAllocator):
        for a in allocator.allocations():
            if not allocator.in_range(a.ip):
                findings.append(
                    Finding(
                        "outside-range",
                        f"{a.ip} ({a.container_id}) is outside the configured range",
                    )
                )
    return findings


def veth_findings(target: Target, allocator: Allocator, repair: bool) -> list[Finding]:
    """Allocations and node-side veths that should come in pairs but do not."""
    from cni import wiring
    from cni.net import link, masq
    from cni.net.netlink import IPRoute
    from cni.netconf import DEFAULT_BPF_DIR

    findings = []
    network = target.config.network
    allocations = {(a.container_id, a.ifname): a for a in allocator.allocations()}
    with IPRoute() as node:
        veths = {(cid, ifname): veth for veth, cid, ifname in link.attachment_links(node, network)}
        for key, a in sorted(allocations.items()):
            if key in veths:
                routed = wiring.node_routed_ips(node, veths[key])
                if str(a.ip) not in routed:
                    findings.append(
                        Finding(
                            "route-mismatch",
                            f"{a.ip} of {key[0]}/{key[1]} is "
                            f"not routed to {veths[key].name} ({routed})",
                        )
                    )
                continue
            finding = Finding("allocation-without-veth", f"{a.ip} held by {key[0]}/{key[1]}")
            if repair and time.time() - a.allocated_at > LEAK_GRACE_SECONDS:
                allocator.release(*key)
                finding.repaired = True
            findings.append(finding)
        for key, veth in sorted(veths.items()):
            if key in allocations:
                continue
            finding = Finding("veth-without-allocation", f"{veth.name} of {key[0]}/{key[1]}")
            if repair:
                bpf_dir = target.plugin.get("bpfDir", DEFAULT_BPF_DIR)
                ips = wiring.unwire(node, wiring.Attachment(network, *key), bpf_dir)
                if ips and target.plugin.get("ipMasq", True):
                    masq.remove(network, ips)
                finding.repaired = True
            findings.append(finding)
    return findings
