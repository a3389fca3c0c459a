"""sluicectl install: put the plugin launchers and a conflist in place."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Any

import click
from click.core import ParameterSource

from cni.datapath.settings import ATTACH_MODES
from cni.install import launcher
from cni.plugin import netconf
from cni.spec.conflist import DEFAULT_CONF

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
    attach: str = "tc",
    routing: str = "native",
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
    plugin["routing"] = routing
    # Always written: a config without it means "tcx" (the parser's default, safe with
    # any chain), where what install picks by default is "tc" (see default_attach).
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


def default_attach(chain: tuple[str, ...]) -> str:
    """ "tc", measured the faster (bench/README.md), unless a chained plugin puts
    an ingress qdisc of its own on the pod's veth (bandwidth): then "tcx"."""
    return "tcx" if "bandwidth" in chain else "tc"


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
    default="enforce",
    show_default=True,
    type=click.Choice(list(netconf.POLICY_MODES)),
    help='NetworkPolicy mode: "enforce" needs the node agent; "off" enforces nothing.',
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
    default=None,
    type=click.Choice(list(ATTACH_MODES)),
    help="How the programs go onto each pod's veth: tc filters on a clsact qdisc "
    "(the default: 2 ms per ADD, where tcx links make the kernel wait 20 ms holding "
    "the RTNL lock), or tcx links (the default with --chain bandwidth, whose ingress "
    "qdisc a clsact qdisc excludes).",
)
@click.option(
    "--routing",
    default="native",
    show_default=True,
    type=click.Choice(list(netconf.ROUTING_MODES)),
    help="How pods reach other nodes' pods: native routes via each node's InternalIP "
    "(the nodes share a network that forwards pod addresses), or vxlan, a tunnel for node "
    "networks that drop packets whose source is not a node (the pod MTU is 50 bytes "
    "smaller unless --mtu is given).",
)
@click.option(
    "--subnet-from-node",
    default=None,
    metavar="NODE",
    help="Take the subnet from this Node's spec.podCIDR in the API (--kubeconfig, or in "
    "a pod its service account), as an init container does with spec.nodeName.",
)
@click.option(
    "--kubeconfig",
    default=None,
    help="The cluster of --subnet-from-node [default: in a pod, its service account; "
    "else $KUBECONFIG or ~/.kube/config].",
)
@click.option(
    "--runtime",
    default=None,
    metavar="DIR",
    help="Copy a Python of sluice's own to DIR (e.g. /opt/sluice/runtime) and have the "
    "launchers use it: for nodes without Python 3.11 (kind's node image).",
)
@click.option(
    "--root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Where the node's filesystem is mounted (an init container's hostPath): the "
    "directories given are the node's, and are written under DIR.",
)
@click.pass_context
def install(
    ctx: click.Context,
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
    attach: str | None,
    routing: str,
    subnet_from_node: str | None,
    kubeconfig: str | None,
    runtime: str | None,
    root: str,
) -> None:
    """Write the sluice and sluice-ipam launchers into BIN_DIR and a conflist into CONF_DIR."""
    attach = attach or default_attach(chain)
    if attach == "tc" and "bandwidth" in chain:
        raise click.UsageError(
            "--attach tc puts a clsact qdisc on each pod's veth, where bandwidth needs "
            "an ingress qdisc of its own: use --attach tcx with --chain bandwidth"
        )
    if subnet_from_node is not None:
        if ctx.get_parameter_source("subnet") != ParameterSource.DEFAULT:
            raise click.UsageError("give --subnet or --subnet-from-node, not both")
        subnet = node_pod_cidr(subnet_from_node, kubeconfig)
    for directory in (bin_dir, conf_dir, runtime):
        if directory is not None and not os.path.isabs(directory):
            raise click.BadParameter(f"{directory!r}: a node path must be absolute")
    if runtime is not None and not launcher.SHELL_SAFE.fullmatch(runtime):
        raise click.BadParameter(
            f"{runtime!r}: only letters, digits and /._+- (it goes into a shell launcher)",
            param_hint="--runtime",
        )
    on_node = lambda path: os.path.join(root, path.lstrip("/"))  # noqa: E731
    if runtime is not None:
        _check_runtime_dir(runtime, bin_dir, conf_dir)
        from pathlib import Path

        from cni.install.runtime import RuntimeCopyError, check_replaceable

        try:
            check_replaceable(Path(on_node(runtime)))  # before anything is written
        except RuntimeCopyError as err:
            raise click.ClickException(str(err)) from None
    os.makedirs(on_node(bin_dir), exist_ok=True)
    os.makedirs(on_node(conf_dir), exist_ok=True)
    texts: dict[str, str | None] = dict.fromkeys(launcher.ENTRY_POINTS)
    if runtime is not None:
        from cni.install import runtime as own_runtime

        try:
            loader = own_runtime.copy_runtime(on_node(runtime))
        except (own_runtime.RuntimeCopyError, OSError) as err:
            raise click.ClickException(f"failed to copy the runtime to {runtime}: {err}") from None
        python = own_runtime.python_dir_name()
        for executable in texts:
            texts[executable] = launcher.render_for_runtime(executable, runtime, loader, python)
        click.echo(f"runtime   {runtime} (Python {python[6:]}, no Python needed on the node)")
    for executable, text in texts.items():
        launcher.write(on_node(bin_dir), executable, text)
        click.echo(f"launcher  {os.path.join(bin_dir, executable)}")
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
        routing,
    )
    path = on_node(os.path.join(conf_dir, conf_name))
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(conflist, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    shown = os.path.join(conf_dir, conf_name)
    click.echo(
        f"conflist  {shown} (network {name!r}, subnet {subnet}, policy {policy}, routing {routing})"
    )
    if subnet_from_node is not None and cluster_cidr is None and ip_masq:
        click.echo(
            f"warning   no --cluster-cidr: clusterCIDR is the node's {subnet}, so pod traffic "
            "to other nodes' pods is masqueraded (give the cluster's pod range)",
            err=True,
        )


def _check_runtime_dir(runtime: str, bin_dir: str, conf_dir: str) -> None:
    """--runtime DIR is replaced whole: never a directory the node keeps other things in."""
    own = os.path.normpath(runtime)
    for option, directory in (("--bin-dir", bin_dir), ("--conf-dir", conf_dir)):
        other = os.path.normpath(directory)
        if own == other or other.startswith(own + "/"):
            raise click.BadParameter(
                f"{runtime!r} is or holds {option} {directory!r}: the runtime needs a "
                "directory of its own (e.g. /opt/sluice/runtime)",
                param_hint="--runtime",
            )
    if own in ("/", "/opt", "/usr", "/etc", "/var", "/opt/cni", "/opt/cni/bin", "/etc/cni"):
        raise click.BadParameter(
            f"{runtime!r} is a system directory: give the runtime a directory of its own",
            param_hint="--runtime",
        )


def node_pod_cidr(node: str, kubeconfig: str | None) -> str:
    """The IPv4 podCIDR the node controller gave ``node``."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", node):
        raise click.BadParameter(f"{node!r} is not a node name", param_hint="--subnet-from-node")
    from cni.kube.api import Api, ApiError
    from cni.kube.kubeconfig import ConfigError

    try:
        api = Api(kubeconfig)
    except (ConfigError, OSError) as err:
        raise click.ClickException(f"failed to reach the API for node {node!r}: {err}") from None
    try:
        found = api.get(f"/api/v1/nodes/{node}")
    except (ApiError, OSError) as err:
        raise click.ClickException(f"failed to read node {node!r}: {err}") from None
    finally:
        api.close()
    if found is None:
        raise click.ClickException(f"node {node!r} does not exist")
    spec = found.get("spec") or {}
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr)
        except ValueError:
            continue
        if network.version == 4:
            return str(network)
    raise click.ClickException(
        f"node {node!r} has no IPv4 podCIDR (spec.podCIDRs: {cidrs}); is the controller "
        "manager allocating node CIDRs (--allocate-node-cidrs)?"
    )
