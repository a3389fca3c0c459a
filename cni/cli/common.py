"""What sluicectl's commands share: finding a network's configuration."""

from __future__ import annotations

import json
import os

import click

from cni.plugin.netconf import NetConf, parse
from cni.spec import conflist as conflist_mod
from cni.spec.conflist import DEFAULT_CONF
from cni.spec.errors import CNIError

conf_option = click.option(
    "--conf", "conf_path", default=None, help=f"The network's conflist [default: {DEFAULT_CONF}]."
)


def load_conflist(conf_path: str | None) -> conflist_mod.Conflist:
    try:
        return conflist_mod.load(conf_path or DEFAULT_CONF)
    except conflist_mod.ConflistError as err:
        raise click.ClickException(str(err)) from None


def netconf_of(conflist: conflist_mod.Conflist, cni_path: tuple[str, ...] = ()) -> NetConf:
    """The sluice plugin's configuration, as the plugin would parse it."""
    try:
        plugin = conflist.plugin()
        return parse(
            plugin,
            stdin=json.dumps(plugin).encode(),
            cni_path=cni_path,
            env={**os.environ, "CNI_PATH": ":".join(cni_path)},
        )
    except conflist_mod.ConflistError as err:
        raise click.ClickException(str(err)) from None
    except CNIError as err:
        raise click.ClickException(f'"{conflist.path}": {err.details}') from None
