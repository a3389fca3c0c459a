"""sluicectl agent: the node agent."""

from __future__ import annotations

import os
import socket

import click

from cni.cli.common import conf_option, load_conflist, netconf_of


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from cni.agent.http_listener import parse_address

    if value is not None:
        try:
            parse_address(value)
        except ValueError as err:
            raise click.BadParameter(str(err), ctx, param) from None
    return value


@click.command()
@conf_option
@click.option(
    "--node-name",
    default=None,
    help="This node's name, as pods' nodeName has it [default: the host name].",
)
@click.option(
    "--metrics-address",
    default=None,
    metavar="HOST:PORT",
    callback=_address,
    help="Serve Prometheus metrics here, with /healthz and /readyz (off by default; "
    "an empty HOST is 127.0.0.1).",
)
@click.option(
    "--health-address",
    default=None,
    metavar="HOST:PORT",
    callback=_address,
    help="Serve /healthz and /readyz here too, on a listener of their own that no "
    "client of the metrics can hold up (off by default).",
)
@click.option(
    "--kubeconfig",
    default=None,
    help="Take Namespaces, Pods, Services and NetworkPolicies from this cluster "
    "(in a pod: its service account, without this option).",
)
@click.option(
    "--resolver",
    type=click.Choice(["agent", "controller"]),
    default="agent",
    show_default=True,
    help="With the API: resolve every policy on this node (agent), or take the selectors "
    "resolved by `sluicectl controller` and watch only this node's share (controller).",
)
@click.option(
    "--verify-interval",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Compare the live datapath with a computation from scratch this often, and "
    "repair and count what drifted (sluice_policy_drift_total); 0: never.",
)
@click.option(
    "--proc-sys",
    default=None,
    metavar="DIR",
    help="Where the node's /proc/sys is mounted, when /proc/sys itself is read-only (a "
    "container that is not privileged): the kernel settings the wiring writes "
    "(net.ipv4.ip_forward, the node-side veths' net.ipv6.conf) go there "
    "[default: /proc/sys].",
)
@click.option("--debug", is_flag=True, help="Log every policy install.")
def agent(
    conf_path: str | None,
    node_name: str | None,
    metrics_address: str | None,
    health_address: str | None,
    kubeconfig: str | None,
    resolver: str,
    verify_interval: float,
    proc_sys: str | None,
    debug: bool,
) -> None:
    """Run the node agent for the network in --conf: serve the plugin's CNI calls on
    the network's agentSocket, and compute and install every pod's policy, from the
    Kubernetes API (--kubeconfig, or in a pod) or from the objects given with
    `sluicectl apply`. Stops cleanly on SIGTERM."""
    from cni.agent.daemon import Agent, setup_logging

    if metrics_address is not None and metrics_address == health_address:
        raise click.UsageError("--health-address must differ from --metrics-address")
    setup_logging(debug)
    if proc_sys is not None:
        from cni.net import sysctl
        from cni.spec.errors import CNIError

        try:
            sysctl.use_root(proc_sys)
        except CNIError as err:
            raise click.BadParameter(err.details, param_hint="--proc-sys") from None
    conf = netconf_of(load_conflist(conf_path))
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    if resolver == "controller" and not (kubeconfig or in_cluster):
        raise click.UsageError("--resolver controller needs the API: --kubeconfig, or a pod")
    name = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
    from cni.agent.prefix_claims import ClaimsConfigError, check_agent_config

    try:
        check_agent_config(conf, name, bool(kubeconfig) or in_cluster)
    except ClaimsConfigError as err:
        raise click.UsageError(str(err)) from None
    from cni.agent.http_listener import ListenError
    from cni.agent.instance_lock import AlreadyServed
    from cni.agent.server import ServerError

    try:
        Agent(
            conf,
            name,
            metrics_address,
            kubeconfig,
            in_cluster,
            resolver,
            verify_interval,
            health_address=health_address,
        ).run()
    except (AlreadyServed, ServerError, ListenError) as err:
        raise click.ClickException(str(err)) from None
