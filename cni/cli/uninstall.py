"""sluicectl uninstall: take sluice off a node, everything ``install`` and the pods'
calls put there.

In order: the conflist (so that the runtime stops calling sluice and the kubelet
reports the node NotReady rather than start pods with a dead plugin), the
launchers and the runtime copy they name, the masquerade table, the pinned
datapath, and, with ``--remove-ipam``, the network's address store. It refuses
while pods of the network are attached (their node-side veths exist) unless
``--force``.

``--conflist-only --unless-daemonset NS/NAME`` is the DaemonSet's preStop hook:
the conflist goes only when that DaemonSet is gone or being deleted, so that a
rolling update (the DaemonSet lives on) keeps the node Ready while its agent
restarts. Launchers stay: the pods still running need them for their DEL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
from collections.abc import Callable

import click

from cni.cli.common import conf_option, load_conflist, netconf_of
from cni.install import launcher
from cni.spec.conflist import DEFAULT_CONF

# What only a launcher written by `sluicectl install` holds, and where its runtime is.
LAUNCHER_MARK = "# sluice CNI plugin launcher, written by `sluicectl install"
RUNTIME_OF_LAUNCHER = re.compile(r"^exec (/[A-Za-z0-9/._+-]+)/lib/\S+ --library-path ", re.M)
SHOWN_PODS = 5


@click.command()
@conf_option
@click.option(
    "--bin-dir",
    default="/opt/cni/bin",
    show_default=True,
    help="Where the launchers are (install's --bin-dir).",
)
@click.option(
    "--root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Where the node's filesystem is mounted: --conf, --bin-dir and the runtime are "
    "the node's paths, found under DIR (stateDir and bpfDir are taken as they are: the "
    "DaemonSet mounts them at the node's paths).",
)
@click.option(
    "--remove-ipam",
    is_flag=True,
    help="Also delete the network's address store (kept by default: a reinstall then "
    "knows which addresses running pods hold).",
)
@click.option("--force", is_flag=True, help="Uninstall even while pods are attached.")
@click.option(
    "--conflist-only",
    is_flag=True,
    help="Remove only the conflist (the node turns NotReady; launchers stay for DELs).",
)
@click.option(
    "--unless-daemonset",
    default=None,
    metavar="NS/NAME",
    help="Do nothing while this DaemonSet exists and is not being deleted (a rolling "
    "update); with the API unreachable, uninstall as asked.",
)
@click.option(
    "--kubeconfig",
    default=None,
    help="The cluster of --unless-daemonset [default: in a pod, its service account].",
)
def uninstall(
    conf_path: str | None,
    bin_dir: str,
    root: str,
    remove_ipam: bool,
    force: bool,
    conflist_only: bool,
    unless_daemonset: str | None,
    kubeconfig: str | None,
) -> None:
    """Remove sluice from this node: conflist, launchers, runtime copy, masquerade
    table, pinned datapath (and the address store with --remove-ipam)."""
    on_node = lambda path: os.path.join(root, path.lstrip("/"))  # noqa: E731
    conf_node_path = conf_path or DEFAULT_CONF
    if unless_daemonset is not None and daemonset_lives(unless_daemonset, kubeconfig):
        click.echo(f"kept      daemonset {unless_daemonset} lives on (an update, not removal)")
        return
    conflist_file = on_node(conf_node_path)
    if conflist_only:
        _remove_file(conflist_file, conf_node_path, "conflist")
        return
    if not os.path.exists(conflist_file):
        raise click.ClickException(
            f'no conflist at "{conf_node_path}": give the network\'s --conf (its stateDir, '
            "bpfDir and name say what to remove)"
        )
    conf = netconf_of(load_conflist(conflist_file))
    if not force:
        attached = attached_pods(conf.network)
        if attached:
            more = " ..." if len(attached) > SHOWN_PODS else ""
            shown = ", ".join(attached[:SHOWN_PODS]) + more
            raise click.ClickException(
                f"{len(attached)} pod(s) of network {conf.network!r} are attached ({shown}): "
                "delete them first, or give --force (their veths then stay until deleted)"
            )
    _remove_file(conflist_file, conf_node_path, "conflist")
    for executable in launcher.ENTRY_POINTS:
        _remove_launcher(on_node(os.path.join(bin_dir, executable)), bin_dir, executable, on_node)
    if conf.ip_masq:
        from cni.net import masq

        masq.drop(conf.network)
        click.echo(f"removed   nftables table ip {masq.table_name(conf.network)}")
    _remove_datapath(conf.bpf_dir)
    state_dir = getattr(conf.ipam, "state_dir", None)
    if remove_ipam and state_dir is not None:
        _remove_ipam_store(state_dir, conf.network)
    elif state_dir is not None:
        click.echo(f"kept      address store under {state_dir} (--remove-ipam deletes it)")


def daemonset_lives(reference: str, kubeconfig: str | None) -> bool:
    """True when the DaemonSet exists and is not being deleted; False when it is gone,
    being deleted, or the API cannot say (then the node is taken off sluice)."""
    namespace, sep, name = reference.partition("/")
    if not sep or not namespace or not name:
        raise click.BadParameter(f"{reference!r} is not NS/NAME", param_hint="--unless-daemonset")
    from cni.kube.api import Api, ApiError
    from cni.kube.kubeconfig import ConfigError

    try:
        api = Api(kubeconfig)
    except (ConfigError, OSError) as err:
        click.echo(f"cannot ask the API about daemonset {reference}: {err}", err=True)
        return False
    try:
        found = api.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
    except (ApiError, OSError) as err:
        click.echo(f"cannot read daemonset {reference}: {err}", err=True)
        return False
    finally:
        api.close()
    return found is not None and not found.get("metadata", {}).get("deletionTimestamp")


def attached_pods(network: str) -> list[str]:
    """Container ids (and ifnames) of the network's pods wired on this node."""
    from cni.net.netlink import node_socket
    from cni.plugin import podnet

    with node_socket() as node:
        return sorted(f"{cid}/{ifname}" for cid, ifname in podnet.node_veths(node, network))


def _remove_file(path: str, shown: str, what: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        click.echo(f"absent    {what} {shown}")
        return
    click.echo(f"removed   {what} {shown}")


def _remove_launcher(
    path: str, bin_dir: str, executable: str, on_node: Callable[[str], str]
) -> None:
    shown = os.path.join(bin_dir, executable)
    try:
        with open(path) as f:
            text = f.read(4096)
    except FileNotFoundError:
        click.echo(f"absent    launcher {shown}")
        return
    except UnicodeDecodeError:
        text = ""
    if LAUNCHER_MARK not in text:
        click.echo(f"kept      {shown}: not a launcher sluicectl install wrote", err=True)
        return
    os.unlink(path)
    click.echo(f"removed   launcher {shown}")
    found = RUNTIME_OF_LAUNCHER.search(text)
    if found is not None:
        _remove_runtime(on_node(found.group(1)), found.group(1))


def _remove_runtime(path: str, shown: str) -> None:
    """The runtime copy: a link to a sibling ``.<name>.*`` directory, which goes too."""
    if os.path.islink(path):
        target = os.path.realpath(path)
        os.unlink(path)
        parent, name = os.path.split(path.rstrip("/"))
        if os.path.dirname(target) == os.path.realpath(parent) and os.path.basename(
            target
        ).startswith(f".{name}."):
            shutil.rmtree(target, ignore_errors=True)
        click.echo(f"removed   runtime {shown}")
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
        click.echo(f"removed   runtime {shown}")


def _remove_datapath(bpf_dir: str) -> None:
    from cni.datapath import loader

    if loader.pinned_layout(bpf_dir) is None:
        click.echo(f"absent    datapath {bpf_dir}")
        return
    import socket

    from cni.datapath import uplink
    from cni.datapath.maps import Datapath
    from cni.net.netlink import node_socket

    # The uplinks' tc filters (where tcx is missing) hold the programs beyond the pins.
    with contextlib.suppress(Exception), Datapath(bpf_dir) as datapath, node_socket() as node:
        for ifindex in uplink.uplinks(datapath):
            with contextlib.suppress(OSError):
                uplink.detach_uplink(datapath, node, socket.if_indextoname(ifindex))
    shutil.rmtree(bpf_dir, ignore_errors=True)
    click.echo(f"removed   datapath {bpf_dir}")


def _remove_ipam_store(state_dir: str, network: str) -> None:
    from ipam.store import store_path

    store = store_path(state_dir, network)
    removed = [p for p in glob.glob(f"{glob.escape(store)}*") if os.path.isfile(p)]
    for path in removed:
        os.unlink(path)
    click.echo(f"{'removed' if removed else 'absent':9} address store {store}")
