"""sluicectl install: put the plugin launchers and a conflist in place."""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

import click

from cni import launcher, netconf
from cni.conflist import DEFAULT_CONF
from cni.datapath.settings import ATTACH_MODES

# Chained plugins sluicectl knows how to configure, with the capabilities
# they need from the runtime.
CHAIN_CAPABILITIES = {
    "portmap": {"portMappings": True},
    "bandwidth": {"bandwidth": True},
    "tuning": {},
}


def build_conflist(
    name: str,
    cni_version: str,
    subnet: str,
    policy: str,
    state_dir: str,
    bpf_dir: str,
    agent_socket: str,
    ip_masq: bool,
    cluster_cidr: str | None,
    mtu: int | None,
    chain: tuple[str, ...],
    attach: str = "tcx",
) -> dict[str, Any]:
    plugin: dict[str, Any] = {
        "type": "sluice",
        "ipMasq": ip_masq,
        "policy": policy,
        "stateDir": state_dir,
        "bpfDir": bpf_dir,
        "agentSocket": agent_socket,
        "ipam": {"type": "sluice-ipam", "subnet": subnet},
    }
    if mtu:
        plugin["mtu"] = mtu
    if cluster_cidr:
        plugin["clusterCIDR"] = cluster_cidr
    if attach != "tcx":
        plugin["datapath"] = {"attach": attach}
    plugins = [plugin]
    for chained in chain:
        entry: dict[str, Any] = {"type": chained}
        if CHAIN_CAPABILITIES[chained]:
            entry["capabilities"] = CHAIN_CAPABILITIES[chained]
        plugins.append(entry)
    return {"cniVersion": cni_version, "name": name, "plugins": plugins}


def _cidr(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(ipaddress.IPv4Network(value))
    except ValueError as err:
        raise click.BadParameter(f"{value!r}: {err}") from None


@click.command()
@click.option(
    "--bin-dir",
    default="/opt/cni/bin",
    show_default=True,
    help="CNI plugin directory the runtime searches (CNI_PATH).",
)
@click.option(
    "--conf-dir",
    default=os.path.dirname(DEFAULT_CONF),
    show_default=True,
    help="Directory of network configurations.",
)
@click.option(
    "--conf-name",
    default=os.path.basename(DEFAULT_CONF),
    show_default=True,
    help="File name of the conflist to write.",
)
@click.option("--name", default="sluice", show_default=True, help="Network name.")
@click.option(
    "--subnet",
    default="10.244.0.0/24",
    show_default=True,
    callback=_cidr,
    help="This node's pod subnet (podCIDR).",
)
@click.option(
    "--cluster-cidr",
    default=None,
    callback=_cidr,
    help="Cluster pod range for ipMasq [default: the subnet].",
)
@click.option(
    "--cni-version",
    default="1.1.0",
    show_default=True,
    type=click.Choice(["0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
    help="Spec version of the conflist (containerd 1.6 needs 1.0.0).",
)
@click.option(
    "--policy",
    default="off",
    show_default=True,
    type=click.Choice(list(netconf.POLICY_MODES)),
    help='NetworkPolicy mode; "enforce" needs the node agent.',
)
@click.option(
    "--ip-masq/--no-ip-masq",
    default=True,
    show_default=True,
    help="Masquerade pod traffic leaving the cluster range.",
)
@click.option(
    "--mtu",
    type=click.IntRange(68, 65535),
    default=None,
    help="Pod MTU [default: the MTU of the node's default-route interface].",
)
@click.option("--state-dir", default=netconf.DEFAULT_STATE_DIR, show_default=True)
@click.option("--bpf-dir", default=netconf.DEFAULT_BPF_DIR, show_default=True)
@click.option("--agent-socket", default=netconf.DEFAULT_AGENT_SOCKET, show_default=True)
@click.option(
    "--chain",
    multiple=True,
    type=click.Choice(sorted(CHAIN_CAPABILITIES)),
    help="Append a reference plugin to the chain (repeatable).",
)
@click.option(
    "--attach",
    default="tcx",
    show_default=True,
    type=click.Choice(list(ATTACH_MODES)),
    help="How the programs go onto each pod's veth: tcx links, or tc filters on a "
    "clsact qdisc (faster to attach; excludes another ingress qdisc, so not with "
    "--chain bandwidth).",
)
def install(
    bin_dir: str,
    conf_dir: str,
    conf_name: str,
    name: str,
    subnet: str,
    cluster_cidr: str | None,
    cni_version: str,
    policy: str,
    ip_masq: bool,
    mtu: int | None,
    state_dir: str,
    bpf_dir: str,
    agent_socket: str,
    chain: tuple[str, ...],
    attach: str,
) -> None:
    """Write the sluice and sluice-ipam launchers into BIN_DIR and a conflist into CONF_DIR."""
    if attach == "tc" and "bandwidth" in chain:
        raise click.UsageError(
            "--attach tc puts a clsact qdisc on each pod's veth, where bandwidth needs "
            "an ingress qdisc of its own: use --attach tcx with --chain bandwidth"
        )
    os.makedirs(bin_dir, exist_ok=True)
    os.makedirs(conf_dir, exist_ok=True)
    for executable in launcher.ENTRY_POINTS:
        click.echo(f"launcher  {launcher.write(bin_dir, executable)}")
    conflist = build_conflist(
        name,
        cni_version,
        subnet,
        policy,
        state_dir,
        bpf_dir,
        agent_socket,
        ip_masq,
        cluster_cidr,
        mtu,
        chain,
        attach,
    )
    path = os.path.join(conf_dir, conf_name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(conflist, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    click.echo(f"conflist  {path} (network {name!r}, subnet {subnet}, policy {policy})")
