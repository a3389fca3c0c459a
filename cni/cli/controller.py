"""sluicectl controller: the cluster-wide policy resolver."""

from __future__ import annotations

import os
import signal
import threading

import click

from cni.controller.publisher import ADDRESS_SET_CAPACITY, TARGETS_CAPACITY
from cni.kube.lease import LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _pod_namespace() -> str:
    """The namespace of the pod this runs in (its lease lives there), else kube-system."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or "kube-system"
    except OSError:
        return "kube-system"


@click.command()
@click.option(
    "--kubeconfig",
    default=None,
    help="The cluster to serve [default: in a pod, its service account; else $KUBECONFIG].",
)
@click.option(
    "--lease-namespace",
    default=None,
    help="Namespace of the leader-election Lease [default: the pod's, else kube-system].",
)
@click.option("--lease-name", default="sluice-controller", show_default=True)
@click.option("--identity", default=None, help="This contender's name [default: host_pid_rnd].")
@click.option(
    "--shard-size",
    type=click.IntRange(min=1),
    default=ADDRESS_SET_CAPACITY,
    show_default=True,
    help="Pods per AddressSet shard at most.",
)
@click.option(
    "--targets-shard-size",
    type=click.IntRange(min=1),
    default=TARGETS_CAPACITY,
    show_default=True,
    help="Pods per PolicyTargets shard at most.",
)
@click.option("--lease-duration", type=float, default=LEASE_SECONDS, show_default=True)
@click.option("--renew-deadline", type=float, default=RENEW_DEADLINE_SECONDS, show_default=True)
@click.option("--retry-period", type=float, default=RETRY_SECONDS, show_default=True)
@click.option("--debug", is_flag=True, help="Log more.")
def controller(
    kubeconfig: str | None,
    lease_namespace: str | None,
    lease_name: str,
    identity: str | None,
    shard_size: int,
    targets_shard_size: int,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    debug: bool,
) -> None:
    """Resolve every NetworkPolicy's selectors once for the cluster and publish them as
    PolicyEndpoints, AddressSets and PolicyTargets (CRDs in conf/policyendpoints.yaml),
    for agents started with `--resolver controller`. Several may run: one leads (a
    Lease), the others stand by. Stops cleanly on SIGTERM, giving the lease up."""
    from cni.agent.daemon import setup_logging
    from cni.controller.controller import Controller
    from cni.kube.api import Api

    setup_logging(debug)
    try:
        api = Api(kubeconfig or os.environ.get("KUBECONFIG"))
        resolver = Controller(
            api,
            lease_namespace=lease_namespace or _pod_namespace(),
            lease_name=lease_name,
            identity=identity,
            capacity=shard_size,
            targets_capacity=targets_shard_size,
            lease=lease_duration,
            renew_deadline=renew_deadline,
            retry=retry_period,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        resolver.run(stopping)
    finally:
        api.close()
