"""sluicectl: the operator's command line."""

from __future__ import annotations

import click

from cni.cli.agent import agent
from cni.cli.controller import controller
from cni.cli.datapath import datapath
from cni.cli.install import install
from cni.cli.ipam import ipam
from cni.cli.objects import apply, delete, explain, get
from cni.cli.status import status
from cni.cli.uninstall import uninstall
from cni.plugin import release


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
# The release (cni/plugin/release.py): the package's version, the image's tag and label.
@click.version_option(release.VERSION, prog_name="sluicectl", message="%(prog)s %(version)s")
def cli() -> None:
    """Operate sluice, a Kubernetes CNI plugin, on this node."""


for command in (agent, controller, apply, delete, get, explain, datapath):
    cli.add_command(command)
cli.add_command(install)
cli.add_command(uninstall)
cli.add_command(ipam)
cli.add_command(status)


def main() -> None:
    cli()
