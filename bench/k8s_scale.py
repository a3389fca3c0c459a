#!/usr/bin/env python3
"""The central resolver at cluster scale, against a real API server.

A control plane only (etcd, kube-apiserver, kube-controller-manager; the test
harness's ``control_plane_only`` cluster on --port-base, so it may run beside a
whole test cluster) holds --nodes Nodes that no kubelet runs, --pods Pods bound to
them (addresses set through the status subresource, as a kubelet would) and
--policies NetworkPolicies in the ten shapes of ``bench/policy_resolve.py``.

Then, once with ``sluicectl controller`` and agents in controller mode, once with
agents resolving on their own: one simulated agent per node (the agent's real
sources and enforcer, a datapath that records installs; ``tests/harness/
simulated_agent.py``), each wiring its node's pods. Agents run in --workers
processes, and the agent of the first node in a process of its own, whose
resident memory and API traffic are reported. Then --changes pod label changes,
one at a time: for each, the nodes whose pods' policy it changes (computed with
the resolver on the bench's own copy of the objects) and the time until each of
them installed a new policy.

Reported: the controller's resident memory (peak and at the end), one agent's
resident memory, the label-change-to-computed latency, the bytes one agent's
watches received (at sync and during the changes), the published objects, and
the memory of 10,000 pods held as the API's JSON and as trimmed model objects.

    .venv/bin/python bench/k8s_scale.py [--pods 10000] [--policies 1000] [--agents 100]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from policy_resolve import APPS, TIERS, namespaces, pods, policies  # noqa: E402

from cni.kube.api import Api  # noqa: E402
from cni.policy.index import PolicyIndex  # noqa: E402
from cni.policy.model import Pod, PodKey, labels_of  # noqa: E402
from cni.policy.parse import parse_pod  # noqa: E402
from cni.policy.published.names import (  # noqa: E402
    ADDRESS_SET,
    POLICY_ENDPOINTS,
    POLICY_TARGETS,
    collection_path,
)

CRDS = ROOT / "conf" / "policyendpoints.yaml"
SLUICECTL = ROOT / ".venv" / "bin" / "sluicectl"
CHANGE_TIMEOUT = 15.0  # an affected node that has not installed by then counts as missed


def rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- the agents' processes ---------------------------------------------------------------


def serve_agents(kubeconfig: str, resolver: str, nodes: list[str]) -> None:
    """An agent process: agents for ``nodes``, answering commands on stdin (JSON lines)."""
    from cni.kube.memory import limit_malloc_arenas
    from tests.harness.simulated_agent import SimulatedAgent, recorded_installs

    limit_malloc_arenas()  # as the agent's daemon does at start
    after_imports = rss_mb()
    setup = Api(kubeconfig)
    with recorded_installs():
        agents = [SimulatedAgent(Api(kubeconfig), node, resolver) for node in nodes]
        started = time.monotonic()
        for agent in agents:
            agent.start()
        for agent in agents:
            agent.wait_ready(600)
        synced = time.monotonic() - started
        for agent in agents:
            local = setup.list(
                "/api/v1/pods", fieldSelector=f"spec.nodeName={agent.node}", resourceVersion="0"
            ).items
            for pod in local:
                meta, status = pod["metadata"], pod.get("status") or {}
                ips = tuple(entry["ip"] for entry in status.get("podIPs") or ())
                agent.wire((meta["namespace"], meta["name"]), ips, wait=120)
        setup.close()
        gc.collect()
        sync_bytes = {a.node: a.api.received_bytes for a in agents}
        reply(
            {
                "ready": True,
                "syncSeconds": synced,
                "wiredSeconds": time.monotonic() - started,
                "afterImportsMb": after_imports,
                "rssMb": rss_mb(),
                "syncBytes": sync_bytes,
            }
        )
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "installs":
                since = command["since"]
                found = []
                for agent in agents:
                    pods = {ifindex: pod for pod, ifindex in agent.ifindex.items()}
                    for install in list(agent.datapath.installs):
                        if install.at > since:
                            found.append([agent.node, *pods[install.ifindex], install.at])
                reply({"installs": found})
            elif command["cmd"] == "stats":
                reply(
                    {
                        "rssMb": rss_mb(),
                        "bytes": {a.node: a.api.received_bytes for a in agents},
                        "wireBytes": {a.node: a.api.wire_bytes for a in agents},
                    }
                )
            else:
                break
        for agent in agents:
            agent.stop()


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class AgentProcess:
    def __init__(self, kubeconfig: str, resolver: str, nodes: list[str], log: Path) -> None:
        self.nodes = nodes
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-agents", resolver, "--kubeconfig", kubeconfig,
             "--serve-nodes", ",".join(nodes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 1800) -> dict[str, Any]:
        return self._read(timeout)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read(120)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                f"agent process for {self.nodes[0]}.. gave no answer; see {self.log.name}"
            )
        return dict(json.loads(line))

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, ValueError):
                self.ask({"cmd": "stop"})
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- the world ----------------------------------------------------------------------------


def create_world(api: Api, args: argparse.Namespace) -> tuple[PolicyIndex, list[str]]:
    from tests.harness.k8s_objects import create_world as create

    all_namespaces = namespaces(args.namespaces)
    all_pods = pods(args.pods, args.namespaces, args.nodes)
    all_policies = policies(args.policies, args.namespaces)
    nodes = [f"node-{i}" for i in range(args.nodes)]
    started = time.monotonic()
    create(api, nodes, all_namespaces, all_pods, all_policies, workers=args.create_workers)
    print(
        f"created {len(nodes)} nodes, {len(all_namespaces)} namespaces, {len(all_pods)} pods "
        f"(with addresses), {len(all_policies)} policies in {time.monotonic() - started:.0f} s"
    )
    index = PolicyIndex()
    for obj in (*all_namespaces, *all_pods, *all_policies):
        index.upsert(obj)
    return index, nodes


def label_change(index: PolicyIndex, rng: random.Random) -> tuple[Pod, dict[str, set[PodKey]]]:
    """A pod that becomes another app (maybe of another tier); the nodes whose pods'
    policies that changes, with those pods. Applied to ``index``."""
    keys = sorted(pod.key for pod in index.store.all_pods())
    while True:
        pod = index.pod(rng.choice(keys))
        assert pod is not None
        app = rng.randrange(APPS)
        labels = {**dict(pod.labels), "app": f"app-{app}", "tier": TIERS[app % 3]}
        changed = replace(pod, labels=labels_of(labels))
        if changed != pod:
            break
    candidates = index.upsert(changed)  # targets of policies whose groups changed, the pod
    index.upsert(pod)
    before = {key: index.resolve(key).endpoint for key in candidates}
    index.upsert(changed)
    affected: dict[str, set[PodKey]] = {}
    for key in candidates:
        found = index.pod(key)
        if found is not None and index.resolve(key).endpoint != before[key]:
            affected.setdefault(found.node_name, set()).add(key)
    return changed, affected


def run_changes(
    api: Api,
    index: PolicyIndex,
    agents: list[AgentProcess],
    count: int,
    rng: random.Random,
) -> tuple[list[float], int, int]:
    """(latency of each affected node, nodes missed, changes with no affected node).
    Only nodes that run an agent count (with fewer agents than nodes, the rest have
    none to miss)."""
    latencies: list[float] = []
    missed = empty = 0
    served = {node for agent in agents for node in agent.nodes}
    for _ in range(count):
        pod, affected = label_change(index, rng)
        affected = {node: pods for node, pods in affected.items() if node in served}
        time.sleep(1.0)  # quiet before
        started = time.monotonic()
        api.patch(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            {"metadata": {"labels": dict(pod.labels)}},
        )
        if not affected:
            empty += 1
            continue
        first: dict[str, float] = {}
        deadline = started + CHANGE_TIMEOUT
        while time.monotonic() < deadline and len(first) < len(affected):
            time.sleep(0.1)
            for agent in agents:
                for node, namespace, name, at in agent.ask({"cmd": "installs", "since": started})[
                    "installs"
                ]:
                    if (namespace, name) in affected.get(node, ()):
                        first[node] = min(first.get(node, at), at)
        latencies += [at - started for at in first.values()]
        missed += len(affected) - len(first)
    return latencies, missed, empty


# -- a mode ---------------------------------------------------------------------------------


def run_mode(
    resolver: str,
    api: Api,
    kubeconfig: str,
    index: PolicyIndex,
    nodes: list[str],
    args: argparse.Namespace,
    logs: Path,
) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": resolver}
    controller = None
    if resolver == "controller":
        controller_log = (logs / "controller.log").open("w")
        started = time.monotonic()
        controller = subprocess.Popen(
            [str(SLUICECTL), "controller", "--kubeconfig", kubeconfig,
             "--lease-namespace", "default"],
            stdout=controller_log, stderr=controller_log,
        )  # fmt: skip
        result["publishSeconds"] = wait_published(logs / "controller.log", started)
        result["controllerRssMb"] = rss_mb(controller.pid)
        result["published"] = published_size(api)
    measured = AgentProcess(kubeconfig, resolver, nodes[:1], logs / f"{resolver}-measured.log")
    rest = nodes[1 : args.agents]
    per = -(-len(rest) // args.workers) if rest else 0
    workers = [
        AgentProcess(kubeconfig, resolver, rest[i : i + per], logs / f"{resolver}-{i // per}.log")
        for i in range(0, len(rest), per)
    ]
    agents = [measured, *workers]
    try:
        started = time.monotonic()
        ready = measured.wait_ready()
        for worker in workers:
            worker.wait_ready()
        result["agentsReadySeconds"] = time.monotonic() - started
        result["agent"] = {
            "afterImportsMb": ready["afterImportsMb"],
            "syncedAndWiredRssMb": ready["rssMb"],
            "syncBytes": ready["syncBytes"][nodes[0]],
            "syncSeconds": ready["syncSeconds"],
        }
        latencies, missed, empty = run_changes(
            api, index, agents, args.changes, random.Random(f"{args.seed}-{resolver}")
        )
        stats = measured.ask({"cmd": "stats"})
        result["agent"]["rssMbAfterChanges"] = stats["rssMb"]
        result["agent"]["totalBytes"] = stats["bytes"][nodes[0]]
        result["agent"]["wireBytes"] = stats["wireBytes"][nodes[0]]
        result["latency"] = {
            "samples": len(latencies),
            "p50": statistics.median(latencies) if latencies else None,
            "p90": percentile(latencies, 0.9) if latencies else None,
            "max": max(latencies) if latencies else None,
            "missedNodes": missed,
            "changesAffectingNoPolicy": empty,
        }
        if controller is not None:
            result["controllerRssMbAfterChanges"] = rss_mb(controller.pid)
            result["controllerPeakRssMb"] = rss_mb(controller.pid, "VmHWM")
    finally:
        for agent in agents:
            agent.stop()
        if controller is not None:
            controller.terminate()
            controller.wait(60)
    return result


def wait_published(log: Path, started: float, quiet: float = 5.0) -> float:
    """Seconds until the controller's first publication, once it has gone quiet."""
    last_seen = 0.0
    last_count = 0
    while True:
        time.sleep(0.5)
        lines = [line for line in log.read_text().splitlines() if "published in" in line]
        if len(lines) != last_count:
            last_count, last_seen = len(lines), time.monotonic()
        elif last_count and time.monotonic() - last_seen > quiet:
            return last_seen - started
        if time.monotonic() - started > 1800:
            raise TimeoutError(f"the controller published nothing in 30 min; see {log}")


def published_size(api: Api) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in (POLICY_ENDPOINTS, ADDRESS_SET, POLICY_TARGETS):
        items = api.list(collection_path(kind), resourceVersion="0").items
        sizes = [len(json.dumps(item)) for item in items]
        out[kind] = {
            "objects": len(items),
            "bytes": sum(sizes),
            "largest": max(sizes, default=0),
            "maxPods": max((len(i["spec"].get("pods", ())) for i in items), default=0),
        }
    return out


# -- trimming ---------------------------------------------------------------------------------


def measure_trimming(kubeconfig: str) -> None:
    """Memory of every pod as the API's JSON, and as trimmed model objects (a process of
    its own, so that nothing else is counted)."""
    api = Api(kubeconfig)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    # The whole response through json.loads, as a client that holds the API's JSON has
    # it (Api.list decodes item by item, which shares no key strings between items).
    response = api.client.get("/api/v1/pods", params={"resourceVersion": "0"})
    raw = json.loads(response.content)["items"]
    del response
    gc.collect()
    raw_bytes = tracemalloc.get_traced_memory()[0] - base
    trimmed = [parse_pod(item) for item in raw]
    del raw
    gc.collect()
    trimmed_bytes = tracemalloc.get_traced_memory()[0] - base
    reply({"pods": len(trimmed), "rawMb": raw_bytes / 2**20, "trimmedMb": trimmed_bytes / 2**20})


# -- main ---------------------------------------------------------------------------------------


def report(
    results: list[dict[str, Any]], trimming: dict[str, Any], args: argparse.Namespace
) -> None:
    print(
        f"\n== {args.pods} pods, {args.policies} policies, {args.nodes} nodes, {args.agents} agents"
    )
    for result in results:
        agent, latency = result["agent"], result["latency"]
        how = "through the controller" if result["mode"] == "controller" else "on their own"
        print(f"-- agents resolving {how}")
        if "controllerRssMb" in result:
            print(
                f"   controller: published in {result['publishSeconds']:.1f} s, "
                f"RSS {result['controllerRssMb']:.1f} MB after publishing, "
                f"{result['controllerRssMbAfterChanges']:.1f} MB after the changes, "
                f"peak {result['controllerPeakRssMb']:.1f} MB"
            )
            for kind, size in result["published"].items():
                print(
                    f"   {kind}: {size['objects']} objects, {size['bytes'] / 2**20:.2f} MB, "
                    f"largest {size['largest'] / 1024:.1f} KB, at most {size['maxPods']} pods"
                )
        print(
            f"   {args.agents} agents synced and wired in {result['agentsReadySeconds']:.0f} s; "
            f"one agent: RSS {agent['syncedAndWiredRssMb']:.1f} MB "
            f"({agent['afterImportsMb']:.1f} MB of it imports), "
            f"{agent['rssMbAfterChanges']:.1f} MB after the changes"
        )
        print(
            f"   one agent's API traffic: {agent['syncBytes'] / 2**20:.2f} MB to sync, "
            f"{(agent['totalBytes'] - agent['syncBytes']) / 1024:.1f} KB during "
            f"{args.changes} label changes (wire: {agent['wireBytes'] / 2**20:.2f} MB in all)"
        )
        if latency["samples"]:
            print(
                f"   label change -> new policy on the affected node: p50 {latency['p50']:.3f} s, "
                f"p90 {latency['p90']:.3f} s, max {latency['max']:.3f} s "
                f"({latency['samples']} node updates; missed {latency['missedNodes']}; "
                f"{latency['changesAffectingNoPolicy']} changes changed no policy)"
            )
    print(
        f"-- {trimming['pods']} pods held as the API's JSON: {trimming['rawMb']:.1f} MB; "
        f"as trimmed model objects: {trimming['trimmedMb']:.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=1_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--agents", type=int, default=100, help="agents (one per node)")
    parser.add_argument("--workers", type=int, default=4, help="processes for the agents")
    parser.add_argument("--changes", type=int, default=30, help="pod label changes per mode")
    parser.add_argument("--modes", default="controller,agent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--port-base", type=int, default=25000)
    parser.add_argument("--create-workers", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--kubeconfig", help="an API server already loaded by an earlier run")
    parser.add_argument("--serve-agents", help=argparse.SUPPRESS)
    parser.add_argument("--serve-nodes", help=argparse.SUPPRESS)
    parser.add_argument("--measure-trimming", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_agents:
        serve_agents(args.kubeconfig, args.serve_agents, args.serve_nodes.split(","))
        return
    if args.measure_trimming:
        measure_trimming(args.kubeconfig)
        return

    from tests.harness.cluster import Cluster

    cluster = None
    if args.kubeconfig is None:
        cluster = Cluster("scale", port_base=args.port_base, control_plane_only=True)
        if cluster.is_up():
            cluster.down()
        cluster.up()
        kubeconfig = str(cluster.kubeconfig)
    else:
        kubeconfig = args.kubeconfig
    logs = Path(tempfile.mkdtemp(prefix="sluice-k8s-scale-"))
    print(f"logs in {logs}")
    api = Api(kubeconfig)
    try:
        if cluster is not None:
            cluster.kubectl("apply", "-f", str(CRDS))
            cluster.kubectl("wait", "--for=condition=Established", "-f", str(CRDS))
            index, nodes = create_world(api, args)
        else:
            index, nodes = load_world(api, args)
        trimming = json.loads(
            subprocess.run(
                [sys.executable, __file__, "--measure-trimming", "--kubeconfig", kubeconfig],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        results = []
        for mode in args.modes.split(","):
            results.append(run_mode(mode, api, kubeconfig, index, nodes, args, logs))
            print(json.dumps(results[-1], indent=1, default=str), flush=True)
        report(results, trimming, args)
        if args.json:
            args.json.write_text(json.dumps({"results": results, "trimming": trimming}, indent=1))
    finally:
        api.close()
        if cluster is not None:
            cluster.down()


def load_world(api: Api, args: argparse.Namespace) -> tuple[PolicyIndex, list[str]]:
    """The objects of an API server loaded earlier, into the bench's own resolver."""
    from cni.policy.parse import parse_namespace
    from cni.policy.parse_policy import parse_network_policy

    index = PolicyIndex()
    for path, parse in (
        ("/api/v1/namespaces", parse_namespace),
        ("/api/v1/pods", parse_pod),
        ("/apis/networking.k8s.io/v1/networkpolicies", parse_network_policy),
    ):
        for item in api.list(path, resourceVersion="0").items:
            index.upsert(parse(item))
    nodes = sorted(
        {pod.node_name for pod in index.store.all_pods()}, key=lambda n: int(n.split("-")[1])
    )
    return index, nodes


if __name__ == "__main__":
    main()
