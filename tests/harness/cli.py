"""Command line for the Kubernetes harness (``python -m tests.harness``).

build                 build Kubernetes v1.34.4 and the images into the cache
up [--agent]          start a cluster; prints `export KUBECONFIG=...`
up --control-plane-only   only etcd, kube-apiserver, kube-controller-manager
up --nodes N          N nodes (network namespaces) on one control plane, cluster
                      "multi" on port base 25000, sluice's agent on each node
down                  stop it and remove everything (also after a crashed up);
                      `down --name multi` for the cluster of several nodes
status                what runs, and the node as kubectl sees it
e2e                   up (agent on, policy enforced), the NetworkPolicy e2e suite,
                      down; prints the tally (`--policy off`: the suite without sluice's
                      enforcement, to see which specs need it; `--nodes 3`: on 3 nodes)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.harness import build, e2e
from tests.harness.cluster import Cluster, sluice_agent_argv
from tests.harness.multinode import CNIS, DEFAULT_NAME, RESOLVERS, ROUTES, MultiNodeCluster


def _cluster(args: argparse.Namespace) -> Cluster | MultiNodeCluster:
    nodes = getattr(args, "nodes", None)
    name = args.name or (DEFAULT_NAME if nodes else "dev")
    if nodes or MultiNodeCluster(name).is_up():
        return MultiNodeCluster(
            name,
            nodes=nodes or 1,
            # Several nodes are for policy across them: the agents enforce, unless told off.
            install_args=(
                f"--policy={getattr(args, 'policy', 'enforce')}",
                *(getattr(args, "install_arg", None) or ()),
            ),
            resolver=getattr(args, "resolver", "agent"),
            routes=getattr(args, "routes", "agent"),
            cni=getattr(args, "cni", "sluice"),
            keep_logs=getattr(args, "keep_logs", None),
        )
    return Cluster(
        name,
        install_args=getattr(args, "install_arg", None) or (),
        agent_argv=sluice_agent_argv if getattr(args, "agent", False) else None,
        keep_logs=getattr(args, "keep_logs", None),
        control_plane_only=getattr(args, "control_plane_only", False),
    )


def _add_cluster_options(parser: argparse.ArgumentParser, default_name: str = "dev") -> None:
    parser.add_argument(
        "--name", help=f'cluster name [{default_name}; with --nodes: "{DEFAULT_NAME}"]'
    )
    parser.add_argument("--nodes", type=int, help="this many nodes (network namespaces)")
    parser.add_argument(
        "--routes",
        choices=ROUTES,
        default="agent",
        help="with --nodes: sluice's agent keeps a route per other node's podCIDR "
        "(agent), or the harness writes them, kindnet's recipe (static, for the "
        "reference plugins) [%(default)s]",
    )
    parser.add_argument(
        "--resolver",
        choices=RESOLVERS,
        default="agent",
        help="with --nodes: the agents resolve policies, or `sluicectl controller` "
        "does (also started) [%(default)s]",
    )
    parser.add_argument("--cni", choices=CNIS, default="sluice", help="with --nodes: [%(default)s]")
    parser.add_argument(
        "--agent",
        action="store_true",
        help="start `sluicectl agent --conf F --kubeconfig K` before the kubelet",
    )
    parser.add_argument(
        "--install-arg",
        action="append",
        metavar="ARG",
        help="extra `sluicectl install` argument, e.g. --install-arg=--policy=enforce",
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the components' logs here at down")
    parser.add_argument(
        "--control-plane-only",
        action="store_true",
        help="etcd, kube-apiserver and kube-controller-manager only (nothing on the node; "
        "may run beside a whole cluster with another SLUICE_K8S_PORT_BASE)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build Kubernetes and the images into the cache")
    _add_cluster_options(commands.add_parser("up", help="start a cluster"))
    down = commands.add_parser("down", help="stop a cluster and remove everything")
    down.add_argument("--name", default="dev", help="[%(default)s]")
    down.add_argument("--keep-logs", type=Path, help="copy the components' logs here first")
    status = commands.add_parser("status", help="show a cluster")
    status.add_argument("--name", default="dev")
    run_e2e = commands.add_parser("e2e", help="up, run the Netpol e2e suite, down")
    _add_cluster_options(run_e2e, default_name="e2e")
    run_e2e.add_argument("--focus", default=e2e.NETPOL_FOCUS, help="[%(default)s]")
    run_e2e.add_argument("--skip", default=e2e.NETPOL_SKIP, help="[%(default)s]")
    run_e2e.add_argument("--report-dir", type=Path, help="JUnit report and e2e.test log")
    run_e2e.add_argument("--quiet", action="store_true", help="do not echo e2e.test's output")
    run_e2e.add_argument(
        "--policy", choices=("enforce", "off"), default="enforce", help="[%(default)s]"
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            build.build()
        elif args.command == "up":
            cluster = _cluster(args)
            cluster.up()
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            leftovers = _cluster(args).down()
            if leftovers:
                print("left behind:\n  " + "\n  ".join(leftovers), file=sys.stderr)
                return 1
        elif args.command == "status":
            print(json.dumps(_cluster(args).status(), indent=2))
        elif args.command == "e2e":
            if args.policy == "enforce":  # what the suite is for: the agent enforcing
                args.agent = True
                args.install_arg = [*(args.install_arg or ()), "--policy=enforce"]
            build.build()
            if args.nodes is None and args.name is None:
                args.name = "e2e"
            with _cluster(args) as cluster:
                tally = e2e.run_netpol(
                    cluster, args.focus, args.skip, args.report_dir, echo=not args.quiet
                )
            print(tally.summary())
            return 0 if not tally.failed else 1
    except (RuntimeError, TimeoutError) as exc:  # BuildFailed, ClusterError, e2e errors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
