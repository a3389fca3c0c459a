"""sluicectl status: is sluice installed, configured and able to serve an ADD?"""

from __future__ import annotations

import json
import os
import subprocess

import click

from cni.cli.common import netconf_of
from cni.install import launcher
from cni.plugin.netconf import DelegatedIPAM, NetConf
from cni.spec import conflist as conflist_mod
from cni.spec import versions
from cni.spec.conflist import DEFAULT_CONF
from cni.spec.errors import CNIError


def launcher_state(bin_dir: str, executable: str) -> tuple[bool, str]:
    path = os.path.join(bin_dir, executable)
    if not os.access(path, os.X_OK):
        return False, f"{path}: missing"
    try:
        proc = subprocess.run(
            [path],
            env={"CNI_COMMAND": "VERSION"},
            input=b"{}",
            capture_output=True,
            timeout=10,
            check=False,
        )
        answer = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as err:
        return False, f"{path}: does not answer VERSION ({err})"
    if versions.CURRENT not in answer.get("supportedVersions", []):
        return False, f"{path}: unexpected VERSION answer {answer}"
    return True, f"{path}: ok"


@click.command()
@click.option(
    "--conf", "conf_path", default=DEFAULT_CONF, show_default=True, help="The network's conflist."
)
@click.option(
    "--bin-dir",
    default="/opt/cni/bin",
    show_default=True,
    help="CNI plugin directory holding the launchers.",
)
def status(conf_path: str, bin_dir: str) -> None:
    """Report what is installed and whether an ADD can be served (exit 1 if not)."""
    ready = True
    for executable in launcher.ENTRY_POINTS:
        ok, line = launcher_state(bin_dir, executable)
        ready &= ok
        click.echo(f"{executable + ':':13}{line}")
    try:
        conflist = conflist_mod.load(conf_path)
        conf = netconf_of(conflist, (bin_dir,))
    except (conflist_mod.ConflistError, click.ClickException) as err:
        click.echo(f"{'conflist:':13}{err}")
        raise SystemExit(1) from None
    click.echo(
        f"{'conflist:':13}{conf_path} (network {conflist.network!r}, "
        f"cniVersion {conflist.cni_version})"
    )
    if conf.policy == "off":
        click.echo(
            f"{'policy:':13}off: NetworkPolicy is NOT enforced on this network "
            "(every verdict is allow; install with --policy enforce to enforce it)"
        )
    else:
        click.echo(f"{'policy:':13}{conf.policy}")
    click.echo(f"{'ipam:':13}{_ipam_summary(conf)}")
    try:
        if conf.policy == "enforce":
            _agent_status(conf)
        from cni.datapath.maps import Datapath
        from cni.plugin.verbs.status import status as status_verb

        with Datapath(conf.bpf_dir) as datapath:
            status_verb(conf, datapath=datapath)
        click.echo(f"{'status:':13}ready")
    except CNIError as err:
        ready = False
        click.echo(f"{'status:':13}not ready: code {err.code}: {err.details}")
    raise SystemExit(0 if ready else 1)


def _agent_status(conf: NetConf) -> None:
    """An enforced network is served by the agent: it must answer and be ready."""
    from cni.plugin.client import AgentUnavailable, call
    from cni.plugin.verbs import agent_required
    from cni.spec.errors import ERR_NOT_AVAILABLE

    try:
        answer = call(conf.agent_socket, {"v": 1, "op": "status"}, timeout=10)
    except AgentUnavailable:
        raise CNIError(ERR_NOT_AVAILABLE, agent_required(conf)) from None
    click.echo(f"{'agent:':13}{answer.get('summary', '')}")
    for what, why in sorted((answer.get("refusedObjects") or {}).items()):
        click.echo(f"{'refused:':13}stored {what}: {why}")
    if not answer.get("ready"):
        raise CNIError(ERR_NOT_AVAILABLE, f"the agent is not ready: {answer.get('reason')}")


def _ipam_summary(conf: NetConf) -> str:
    if isinstance(conf.ipam, DelegatedIPAM):
        return f"{conf.ipam.plugin_type} (delegated)"
    try:
        from ipam.errors import IPAMError
        from ipam.modes import open_allocator
        from ipam.report import network_report

        with open_allocator(conf.ipam) as allocator:
            report = network_report(allocator)
    except IPAMError as err:
        return f"sluice-ipam: {err}"
    stats, where = report["stats"], report.get("subnet") or report.get("pool")
    return (
        f"sluice-ipam {report['mode']} {where}: {stats['allocated']} allocated, "
        f"{stats['free']} free (store {conf.ipam.state_dir})"
    )
