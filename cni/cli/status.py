"""sluicectl status: is sluice installed, configured and able to serve an ADD?"""

from __future__ import annotations

import json
import os
import subprocess

import click

from cni import conflist as conflist_mod
from cni import launcher, versions
from cni.conflist import DEFAULT_CONF
from cni.errors import CNIError
from cni.protocol import Request


def status_request(conflist: conflist_mod.Conflist, bin_dir: str) -> Request:
    plugin = conflist.plugin()
    return Request(
        command="STATUS",
        cni_version=conflist.cni_version,
        network=conflist.network,
        config=plugin,
        raw_config=json.dumps(plugin).encode(),
        env={"CNI_PATH": bin_dir},
    )


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
        request = status_request(conflist, bin_dir)
    except conflist_mod.ConflistError as err:
        click.echo(f"{'conflist:':13}{err}")
        raise SystemExit(1) from None
    plugin = request.config
    click.echo(
        f"{'conflist:':13}{conf_path} (network {conflist.network!r}, "
        f"cniVersion {conflist.cni_version})"
    )
    click.echo(f"{'policy:':13}{plugin.get('policy', 'enforce')}")
    click.echo(f"{'ipam:':13}{_ipam_summary(request)}")
    try:
        from cni.verbs import status as status_verb

        if versions.at_least(conflist.cni_version, "1.1.0"):
            status_verb.run(request)
        click.echo(f"{'status:':13}ready")
    except CNIError as err:
        ready = False
        click.echo(f"{'status:':13}not ready: code {err.code}: {err.details}")
    raise SystemExit(0 if ready else 1)


def _ipam_summary(request: Request) -> str:
    ipam = request.config.get("ipam") or {}
    if ipam.get("type") != "sluice-ipam":
        return f"{ipam.get('type')} (delegated)"
    try:
        from ipam import config as ipam_config
        from ipam.allocator import open_allocator
        from ipam.report import network_report

        config = ipam_config.parse(request.network, request.config)
        with open_allocator(config) as allocator:
            report = network_report(allocator)
        stats, where = report["stats"], report.get("subnet") or report.get("pool")
        return (
            f"sluice-ipam {report['mode']} {where}: {stats['allocated']} allocated, "
            f"{stats['free']} free (store {config.state_dir})"
        )
    except CNIError as err:
        return f"sluice-ipam: {err.details}"
