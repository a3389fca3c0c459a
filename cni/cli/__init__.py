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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
# The installed distribution's version: pyproject.toml's, the one the image is tagged with.
@click.version_option(package_name="sluice", prog_name="sluicectl", message="%(prog)s %(version)s")
def cli() -> None:
    """Operate sluice, a Kubernetes CNI plugin, on this node."""


for command in (agent, controller, apply, delete, get, explain, datapath):
    cli.add_command(command)
cli.add_command(install)
cli.add_command(ipam)
cli.add_command(status)


def main() -> None:
    cli()
