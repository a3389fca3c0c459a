"""sluicectl datapath: load the eBPF programs, look at them, watch what they deny."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import click

from cni.cli.common import conf_option
from cni.plugin.netconf import DEFAULT_BPF_DIR
from cni.spec import conflist as conflist_mod
from cni.spec.conflist import DEFAULT_CONF


def plugin_of(conf_path: str | None) -> dict[str, Any]:
    try:
        return conflist_mod.load(conf_path or DEFAULT_CONF).plugin()
    except conflist_mod.ConflistError as err:
        raise click.ClickException(f"{err} (or pass --bpf-dir)") from None


def bpf_dir_of(conf_path: str | None, bpf_dir: str | None) -> str:
    if bpf_dir:
        return bpf_dir
    return str(plugin_of(conf_path).get("bpfDir", DEFAULT_BPF_DIR))


def settings_of(conf_path: str | None, bpf_dir: str | None) -> Any:
    """The plugin config's "datapath" settings (defaults with --bpf-dir and no --conf)."""
    from cni.datapath import settings

    if bpf_dir and not conf_path:
        return settings.DatapathSettings()
    try:
        return settings.from_plugin(plugin_of(conf_path))
    except ValueError as err:
        raise click.ClickException(str(err)) from None


bpf_dir_option = click.option("--bpf-dir", default=None, help="The datapath's bpffs directory.")
output_option = click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)


def _open(bpf_dir: str) -> Any:
    from cni.datapath.maps import Datapath

    datapath = Datapath(bpf_dir)
    if not datapath.is_loaded():
        raise click.ClickException(
            f'no datapath is loaded in "{bpf_dir}" (sluicectl datapath load)'
        )
    return datapath


@click.group()
def datapath() -> None:
    """The eBPF programs on the pods' veths and their maps."""


@datapath.command()
@conf_option
@bpf_dir_option
@click.option("--force", is_flag=True, help="Compile and reload even if the source is unchanged.")
@click.option(
    "--replace",
    is_flag=True,
    help="Replace a datapath pinned with other struct layouts or map sizes "
    "(its pods drop all traffic until they are registered again).",
)
def load(conf_path: str | None, bpf_dir: str | None, force: bool, replace: bool) -> None:
    """Compile the programs (bcc) and pin them with their maps; switch attached veths.

    Live maps (endpoints, policies, conntrack) are kept, so established flows
    survive a reload. The network config's "datapath" settings take effect:
    tunables at once, map sizes with --replace.
    """
    from cni.datapath import loader
    from cni.spec.errors import CNIError

    directory = bpf_dir_of(conf_path, bpf_dir)
    settings = settings_of(conf_path, bpf_dir)
    started = time.monotonic()
    try:
        loaded = loader.load(directory, force=force, settings=settings, replace=replace)
    except CNIError as err:
        raise click.ClickException(err.details) from None
    if loaded:
        click.echo(f"loaded the datapath into {directory} in {time.monotonic() - started:.1f} s")
    else:
        click.echo(f"the datapath in {directory} is current (use --force to reload)")


def show_report(bpf_dir: str) -> dict[str, Any]:
    from cni.datapath import after_nat, bpf, bpf_programs, loader
    from cni.datapath.attach import HOOKS, UPLINK_HOOKS
    from cni.datapath.endpoint_check import attached_programs
    from cni.datapath.maps import MAPS
    from cni.datapath.structs import ip_str
    from cni.datapath.uplink import uplinks
    from cni.net.netlink import Rtnl
    from cni.spec.attachment import parse_alias

    programs = {}
    for name in (*HOOKS, *UPLINK_HOOKS):
        fd = bpf.obj_get(os.path.join(bpf_dir, name))
        try:
            info = bpf_programs.prog_info(fd)
        finally:
            os.close(fd)
        programs[name] = {"id": info.id, "tag": bytes(info.tag).hex(), "name": info.name.decode()}
    with _open(bpf_dir) as dp, Rtnl() as ipr:
        links = {msg["index"]: msg for msg in ipr.dump_links()}
        addresses: dict[int, list[str]] = {}
        for ip, owner_index in sorted(dp.endpoints.ips().items()):
            addresses.setdefault(owner_index, []).append(ip)
        endpoints = []
        for ifindex, ep in sorted(dp.endpoints.all().items()):
            link = links.get(ifindex)
            owner = parse_alias(link.get("IFLA_IFALIAS")) if link else None
            table = dp.conntrack.fill(ifindex)
            endpoints.append(
                {
                    "ifindex": ifindex,
                    "veth": link.get("IFLA_IFNAME") if link else None,
                    "ip": ip_str(ep.ip),
                    "ips": addresses.get(ifindex, []),
                    "network": owner[0] if owner else None,
                    "containerID": owner[1] if owner else None,
                    "policyGeneration": ep.policy_gen,
                    "policies": {"egress": ep.egress_policy, "ingress": ep.ingress_policy},
                    "isolated": [
                        d
                        for d, pid in (("egress", ep.egress_policy), ("ingress", ep.ingress_policy))
                        if pid
                    ],
                    "conntrackSlot": ep.ct_slot,
                    "attached": sorted(attached_programs(dp, ipr, ifindex)) if link else [],
                    "conntrack": None
                    if table is None
                    else {
                        "entries": table.entries,
                        "inbound": table.inbound,
                        "max": table.capacity,
                        "created": table.created,
                        "removed": table.removed,
                        "evicted": table.evicted,
                    },
                }
            )
        fill = {}
        for name in (
            "endpoints",
            "ep_by_ip",
            "service_ips",
            "peers",
            "rules",
            "ct_tables",
            "ct_free",
            "ct_dirty",
            "policy_index",
        ):
            map_info = bpf.map_info(dp.fd(name))
            fill[name] = {
                "entries": sum(1 for _ in dp.keys(name, _key_type(name))),
                "max": map_info.max_entries,
            }
        config = {
            name: getattr(dp.config(), name) for name, _ in dp.config()._fields_ if name != "pad"
        }
        uplink_names = [links[i].get("IFLA_IFNAME") if i in links else str(i) for i in uplinks(dp)]
        after_nat_hooks = after_nat.attached(dp)
    return {
        "bpfDir": bpf_dir,
        "current": loader.is_current(bpf_dir),
        "layout": loader.pinned_layout(bpf_dir),
        "programs": programs,
        "maps": sorted(MAPS),
        "mapFill": fill,
        "config": config,
        "uplinks": uplink_names,
        "afterNat": after_nat_hooks,
        "endpoints": endpoints,
    }


def _key_type(name: str) -> Any:
    import ctypes

    from cni.datapath import structs

    if name == "policy_index":
        return structs.PolicyDigest
    return ctypes.c_uint32


@datapath.command()
@conf_option
@bpf_dir_option
@output_option
def show(conf_path: str | None, bpf_dir: str | None, output: str) -> None:
    """Programs, attached endpoints and how full the maps are."""
    report = show_report(bpf_dir_of(conf_path, bpf_dir))
    if output == "json":
        click.echo(json.dumps(report, indent=2))
        return
    state = "current" if report["current"] else "from another source (sluicectl datapath load)"
    click.echo(f"datapath {report['bpfDir']}  ({state})")
    for name, prog in report["programs"].items():
        click.echo(f"  program {name:<12} id {prog['id']:<6} tag {prog['tag']}")
    fills = "  ".join(f"{n} {f['entries']}/{f['max']}" for n, f in report["mapFill"].items())
    click.echo(f"  maps     {fills}")
    click.echo(
        f"  {'IFINDEX':<9}{'VETH':<16}{'POD IP':<16}{'GEN':<6}{'ISOLATED':<17}"
        f"{'ATTACHED':<18}NETWORK/CONTAINER"
    )
    for ep in report["endpoints"]:
        owner = f"{ep['network']}/{(ep['containerID'] or '')[:20]}" if ep["network"] else "-"
        click.echo(
            f"  {ep['ifindex']:<9}{ep['veth'] or '(gone)':<16}{ep['ip']:<16}"
            f"{ep['policyGeneration']:<6}{','.join(ep['isolated']) or '-':<17}"
            f"{','.join(ep['attached']) or '-':<18}{owner}"
        )
        ct = ep["conntrack"]
        if ct is not None:
            click.echo(
                f"  {'':<9}conntrack {ct['entries']}/{ct['max']} ({ct['inbound']} inbound), "
                f"created {ct['created']}, "
                f"removed {ct['removed']}, evicted {ct['evicted']}"
                + (f"; addresses {', '.join(ep['ips'])}" if len(ep["ips"]) > 1 else "")
            )
    if report["uplinks"]:
        click.echo(f"  uplinks  {', '.join(report['uplinks'])}")
    judged = ", ".join(report["afterNat"]) or "none: flows to ClusterIPs from isolated pods refused"
    click.echo(f"  after DNAT (netfilter) {judged}")


@datapath.command()
@conf_option
@bpf_dir_option
@output_option
def counters(conf_path: str | None, bpf_dir: str | None, output: str) -> None:
    """Packets allowed, denied and dropped (by reason), per direction, since load."""
    with _open(bpf_dir_of(conf_path, bpf_dir)) as dp:
        totals = dp.counters()
    if output == "json":
        click.echo(json.dumps(totals, indent=2))
        return
    headings = {
        "egress": "EGRESS (from pods)",
        "ingress": "INGRESS (to pods)",
        "network": "NETWORK (in)",
    }
    columns = [d for d in headings if d in totals]
    click.echo(f"{'REASON':<20}" + "".join(f"{headings[d]:>20}" for d in columns))
    for reason in totals["egress"]:
        click.echo(f"{reason:<20}" + "".join(f"{totals[d][reason]:>20}" for d in columns))


@datapath.command()
@conf_option
@bpf_dir_option
@click.option("--count", type=int, default=0, help="Stop after this many events.")
@click.option("--timeout", type=float, default=None, help="Stop after this many idle seconds.")
@click.option("--backlog", is_flag=True, help="Start with the events already queued.")
@output_option
def monitor(
    conf_path: str | None,
    bpf_dir: str | None,
    count: int,
    timeout: float | None,
    backlog: bool,
    output: str,
) -> None:
    """Stream deny events: source and destination (with their pods, where this node
    knows them), protocol, ports, reason; a frame that is not IPv4 by its EtherType
    (rate-limited)."""
    from cni.cli.event_names import PodNames, as_json, describe
    from cni.datapath.events import follow

    directory = bpf_dir_of(conf_path, bpf_dir)
    names = PodNames(_open(directory), state_dir_of(conf_path, directory))
    boot = time.time() - time.monotonic()  # the events carry CLOCK_MONOTONIC times
    events = follow(os.path.join(directory, "events"), timeout, backlog)
    with names.datapath:
        for seen, event in enumerate(events, 1):
            when = datetime.fromtimestamp(boot + event.timestamp_ns / 1e9, UTC)
            if output == "json":
                click.echo(json.dumps({"time": when.isoformat(), **as_json(names, event)}))
            else:
                click.echo(
                    f"{when:%H:%M:%S.%f} {event.reason:<16} {event.direction:<7} "
                    f"{describe(names, event)}"
                )
            if count and seen >= count:
                return


def state_dir_of(conf_path: str | None, bpf_dir: str) -> str | None:
    """The stateDir of the network config whose bpfDir this is (--conf, or the
    default one), where the pods' names are; None if no config names this bpfDir."""
    from cni.plugin.netconf import DEFAULT_STATE_DIR

    try:
        plugin = conflist_mod.load(conf_path or DEFAULT_CONF).plugin()
    except conflist_mod.ConflistError:
        return None
    if str(plugin.get("bpfDir", DEFAULT_BPF_DIR)) != bpf_dir:
        return None
    return str(plugin.get("stateDir", DEFAULT_STATE_DIR))


@datapath.command()
@conf_option
@click.option("--repair", is_flag=True, help="Make the differences found good.")
@output_option
def verify(conf_path: str | None, repair: bool, output: str) -> None:
    """Compare the live maps with what the agent computes from scratch: each endpoint's
    rule sets, read back from the pinned maps, against its policy resolved anew from
    the agent's objects; its addresses; the ClusterIPs. Exits 1 when they differ."""
    from cni.cli.objects import ask

    report = ask(conf_path, {"op": "verify", "repair": repair})["report"]
    if output == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        for difference in report["differences"]:
            click.echo(f"{difference['kind']:<9} {difference['subject']}: {difference['detail']}")
        pending = f", {len(report['pending'])} pending" if report["pending"] else ""
        click.echo(
            f"{report['checked']} endpoint(s) checked{pending}, "
            f"{len(report['differences'])} difference(s) in {report['seconds'] * 1000:.1f} ms"
            + (" (repaired)" if repair and report["differences"] else "")
        )
    if report["differences"]:
        raise SystemExit(1)
