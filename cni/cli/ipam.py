"""sluicectl ipam: show, garbage-collect and check a network's addresses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import click

from cni.cli.common import conf_option, load_conflist, netconf_of
from cni.plugin.netconf import NetConf
from cni.spec.conflist import ConflistError
from ipam import config as ipam_config
from ipam.allocator import Allocator
from ipam.errors import IPAMError
from ipam.modes import open_allocator
from ipam.store import Store, store_networks, store_path

NODE_CIDR_BLOCK = 28  # the block size fragmentation is measured in, in node-CIDR mode


@dataclass(frozen=True)
class Target:
    """A network's IPAM, with the sluice plugin's configuration when sluice wires it."""

    config: ipam_config.NodeCIDRConfig | ipam_config.PrefixConfig
    sluice: NetConf | None = None


def _fail(message: str) -> None:
    raise click.ClickException(message)


def targets_from(conf_path: str | None, state_dir: str | None) -> list[Target]:
    try:
        if state_dir:
            return [
                Target(ipam_config.parse(name, snapshot)) for name, snapshot in _stored(state_dir)
            ]
        conflist = load_conflist(conf_path)
        if any(p.get("type") == "sluice" for p in conflist.data["plugins"] if isinstance(p, dict)):
            conf = netconf_of(conflist)
            if isinstance(conf.ipam, ipam_config.IPAMConfig):
                return [Target(conf.ipam, conf)]
        plugin = conflist.ipam_plugin()
        return [Target(ipam_config.parse(plugin["name"], plugin["ipam"], plugin.get("stateDir")))]
    except (ConflistError, IPAMError) as err:
        _fail(str(err))
    return []


def _stored(state_dir: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for network in store_networks(state_dir):
        with Store(store_path(state_dir, network), network) as store:
            snapshot = store.config()
        if snapshot:
            yield network, {**snapshot, "stateDir": state_dir}


@contextmanager
def opened(target: Target, kubeconfig: str | None = None) -> Iterator[Allocator]:
    """The target's allocator; where its claims live in the Kubernetes API, with them
    listed from there (``kubeconfig``; in a pod its service account)."""
    try:
        with _claims_for(target.config, kubeconfig), open_allocator(target.config) as allocator:
            yield allocator
    except IPAMError as err:
        _fail(str(err))


@contextmanager
def _claims_for(
    config: ipam_config.NodeCIDRConfig | ipam_config.PrefixConfig, kubeconfig: str | None
) -> Iterator[None]:
    from cni.agent.prefix_claims import api_claims, uses_api_claims
    from cni.kube.kubeconfig import ConfigError

    if not uses_api_claims(config):
        yield
        return
    assert isinstance(config, ipam_config.PrefixConfig)
    try:
        with api_claims(config, kubeconfig):
            yield
    except ConfigError as err:
        _fail(f"the claims of network {config.network} live in the Kubernetes API: {err}")


kubeconfig_option = click.option(
    "--kubeconfig",
    default=None,
    help='Where the claims live in the API ("claimStore": "kubernetes"): this cluster '
    "[default: in a pod its service account, else $KUBECONFIG or ~/.kube/config].",
)


output_option = click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)


@click.group()
def ipam() -> None:
    """Addresses: show them, release stale ones, check for leaks and duplicates."""


@ipam.command()
@conf_option
@click.option("--state-dir", default=None, help="Show every network stored here instead.")
@kubeconfig_option
@output_option
def show(conf_path: str | None, state_dir: str | None, kubeconfig: str | None, output: str) -> None:
    """Pools, prefixes, claims, allocations and fragmentation."""
    from ipam.report import network_report

    networks = []
    for target in targets_from(conf_path, state_dir):
        with opened(target, kubeconfig) as allocator:
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
@kubeconfig_option
def gc(
    conf_path: str | None,
    valid: tuple[str, ...],
    none_valid: bool,
    dry_run: bool,
    kubeconfig: str | None,
) -> None:
    """Release every attachment not listed with --valid, as CNI GC does.

    For a sluice network this runs the plugin's own GC, which also removes the
    attachments' veths and masquerade entries.
    """
    if not valid and not none_valid:
        _fail("name the attachments still in use with --valid, or pass --none-valid")
    keep = parse_valid(valid)
    (target,) = targets_from(conf_path, None)
    with opened(target, kubeconfig) as allocator:
        stale = [a for a in allocator.allocations() if (a.container_id, a.ifname) not in keep]
    for a in stale:
        click.echo(
            f"{'would release' if dry_run else 'release'} {a.ip} {a.container_id}/{a.ifname}"
        )
    if dry_run:
        return
    if target.sluice is not None:
        from cni.datapath.maps import Datapath
        from cni.plugin.verbs.gc import gc as gc_verb
        from cni.spec.errors import CNIError

        try:
            with (
                _claims_for(target.config, kubeconfig),
                Datapath(target.sluice.bpf_dir) as datapath,
            ):
                gc_verb(target.sluice, keep, datapath=datapath)
        except CNIError as err:
            _fail(f"GC finished with errors: {err.details}")
    else:
        with opened(target, kubeconfig) as allocator:
            allocator.gc(keep)
    click.echo(f"released {len(stale)} attachment(s)")


@ipam.command()
@conf_option
@click.option("--repair", is_flag=True, help="Fix what is safe to fix.")
@kubeconfig_option
@output_option
def check(conf_path: str | None, repair: bool, kubeconfig: str | None, output: str) -> None:
    """Find leaked allocations, veths without an allocation, and duplicates (exit 1)."""
    from ipam.check import check_attachments, check_store

    (target,) = targets_from(conf_path, None)
    with opened(target, kubeconfig) as allocator:
        findings = check_store(allocator)
        if target.sluice is not None:  # only sluice creates veths to check against
            with _node_attachments(target.sluice) as (listing, remove):
                findings += check_attachments(allocator, listing, repair, remove)
    network = target.config.network
    if output == "json":
        report = {"network": network, "findings": [asdict(f) for f in findings]}
        click.echo(json.dumps(report, indent=2))
    else:
        for f in findings:
            click.echo(f"{f.kind:<26}{f.detail}{'  (repaired)' if f.repaired else ''}")
        if not findings:
            click.echo(f"network {network}: no problem found")
    raise SystemExit(1 if any(not f.repaired for f in findings) else 0)


@contextmanager
def _node_attachments(conf: NetConf) -> Iterator[tuple[Any, Any]]:
    """How to list the network's veths with the addresses routed to them, and how to
    remove one (veth, datapath endpoint, masquerade entries)."""
    from cni.datapath.endpoint import DatapathEndpoints
    from cni.datapath.maps import Datapath
    from cni.net import masq
    from cni.net.netlink import node_socket
    from cni.plugin import podnet

    with node_socket() as node, Datapath(conf.bpf_dir) as datapath:

        def listing() -> dict[tuple[str, str], list[str]]:
            veths = podnet.node_veths(node, conf.network)
            return {key: podnet.node_routed_ips(node, veth) for key, veth in veths.items()}

        def remove(container_id: str, ifname: str) -> None:
            veth = podnet.node_veths(node, conf.network).get((container_id, ifname))
            if veth is None:
                return
            ips = podnet.node_routed_ips(node, veth)
            podnet.disconnect(node, veth, DatapathEndpoints(datapath), ips)
            if conf.ip_masq:
                masq.remove(conf.network, ips)

        yield listing, remove


def _claim_lines(net: dict[str, Any]) -> list[str]:
    """Every claim of the pool, by whichever node holds it."""
    where = "the Kubernetes API" if net["claimStore"] == "kubernetes" else "the local claim store"
    stats = net["stats"]
    lines = [
        f"  claims of the pool in {where}: {len(net['claims'])}  largest free address block "
        f"{stats['largestFreeAddressBlock'] or 'none'}",
        f"  {'CLAIM':<20}{'NODE':<28}{'USED':>6}  RELEASED",
    ]
    for c in net["claims"]:
        lines.append(
            f"  {c['cidr']:<20}{c['node'][:26]:<28}{c['used']:>6}  {c['releasedAt'] or '-'}"
        )
    return lines


def render_table(report: dict[str, Any]) -> str:
    """The human form: the fragmentation numbers first, then the details."""
    lines: list[str] = []
    for net in report["networks"]:
        stats = net["stats"]
        where = net.get("subnet") or f"{net['pool']} (blocks of /{net['prefixLength']})"
        lines.append(f"network {net['name']}  mode {net['mode']}  {where}")
        lines.append(
            f"  allocated {stats['allocated']}  free {stats['free']}  "
            f"cooling {len(net['cooling'])}  free aligned /"
            f"{net['prefixLength'] or NODE_CIDR_BLOCK} blocks {stats['freeAlignedBlocks']}  "
            f"largest free block {stats['largestFreeBlock'] or 'none'}"
        )
        if net["mode"] == "prefix":
            packing = stats["packing"]
            lines.append(
                f"  node {net['node']}  prefixes held {stats['prefixesHeld']}  minimum "
                f"{stats['prefixesMinimum']}  packing {packing if packing else '-'}"
            )
            lines.append(f"  {'PREFIX':<20}{'USED':>6}{'COOLING':>9}{'FREE':>6}")
            for p in net["prefixes"]:
                lines.append(f"  {p['cidr']:<20}{p['used']:>6}{p['cooling']:>9}{p['free']:>6}")
            lines.extend(_claim_lines(net))
        if net["allocations"]:
            lines.append(f"  {'IP':<17}{'CONTAINER':<26}{'IFNAME':<8}{'POD':<30}ALLOCATED")
            for a in net["allocations"]:
                pod = f"{a['podNamespace']}/{a['podName']}" if a["podName"] else "-"
                lines.append(
                    f"  {a['ip']:<17}{a['containerID'][:24]:<26}{a['ifname']:<8}"
                    f"{pod[:28]:<30}{a['allocatedAt']}"
                )
        for c in net["cooling"]:
            lines.append(f"  cooling {c['ip']} since {c['releasedAt']}")
        lines.append("")
    return "\n".join(lines)
