#!/usr/bin/env python3
"""Pod start at scale on three real nodes: sluice against ptp + host-local.

The test harness's cluster of several nodes (tests/harness/multinode.py: one
control plane, --nodes network namespaces each with its own containerd, kubelet,
kube-proxy and sluice agent, static routes between the nodes' podCIDRs, kindnet's
recipe) runs one Deployment of ``agnhost pause`` pods. Each round scales it from 0
to --replicas and measures, from the scale command, the time until every pod is
Ready and until every pod is reachable from a pod on another node (a TCP connect
to a closed port that is answered by a reset counts: the packet got there and the
answer came back). Rounds alternate between the CNIs (sluice with ``"policy":
"enforce"`` and its agents, then ptp + host-local with ``ipMasq``, then the other
order), swapping the nodes' conflists between rounds while no pod runs; the
agents keep running in the ptp rounds, so both see the same background.

    flock /work/locks/cpu-heavy.lock .venv/bin/python bench/pod_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.harness.cache import AGNHOST_IMAGE  # noqa: E402
from tests.harness.multinode import MultiNodeCluster, Node  # noqa: E402

NAMESPACE = "podstart"
DEPLOYMENT = "podstart"
CLOSED_PORT = 9  # nothing listens: a reset answers
ROUND_TIMEOUT = 900.0

# Runs in a prober pod's network namespace: reads "ip" lines, prints "ip t" once
# ip answers (connect or reset), t on CLOCK_MONOTONIC (the same in every namespace).
PROBER = r"""
import socket, sys, threading, time
PORT = int(sys.argv[1])
lock = threading.Lock()
def probe(ip):
    while True:
        s = socket.socket(); s.settimeout(0.5)
        try:
            s.connect((ip, PORT)); ok = True
        except ConnectionRefusedError:
            ok = True
        except OSError:
            ok = False
        finally:
            s.close()
        if ok:
            with lock:
                print(ip, time.monotonic(), flush=True)
            return
        time.sleep(0.05)
for line in sys.stdin:
    threading.Thread(target=probe, args=(line.strip(),), daemon=True).start()
"""


def read_lines(prober: subprocess.Popen[str], into: queue.Queue[str]) -> None:
    assert prober.stdout is not None
    for line in prober.stdout:
        into.put(line)


def deployment(replicas: int) -> dict[str, Any]:
    labels = {"app": DEPLOYMENT}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "c",
                            "image": AGNHOST_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["pause"],
                        }
                    ],
                },
            },
        },
    }


def prober_pod(node: Node) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"prober-{node.index}", "namespace": NAMESPACE},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": AGNHOST_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["pause"],
                }
            ],
        },
    }


def apply(cluster: MultiNodeCluster, *objects: dict[str, Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    cluster.kubectl("apply", "-f", "-", stdin=manifest)


def sandbox_netns(node: Node, pod: str) -> str:
    containerd = node.containerd()
    ids = containerd.crictl(
        "pods", "--namespace", NAMESPACE, "--name", pod, "--state", "ready", "-q"
    ).stdout.split()
    info = containerd.crictl_json("inspectp", ids[0])
    return f"/proc/{info['info']['pid']}/ns/net"


def use_cni(cluster: MultiNodeCluster, cni: str) -> None:
    """Put ``cni``'s conflist in every node's conf dir (the other's waits beside it),
    once no sandbox is left for the other CNI to tear down."""
    for node in cluster.nodes:
        deadline = time.monotonic() + 300
        while node.containerd().crictl("pods", "-q", check=False, timeout=30).stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandboxes still on {node.name} after 300 s")
            time.sleep(1)
        parked = node.directory / "cni" / "parked"
        parked.mkdir(exist_ok=True)
        ptp = parked / "10-ptp.conflist"
        if not ptp.exists():
            conf = cluster.ptp_conf(node)  # the harness's reference configuration
            ptp.write_text(json.dumps(conf, indent=2) + "\n")
            for plugin in ("ptp", "host-local", "portmap"):
                link = node.cni_bin_dir / plugin
                if not link.exists():
                    link.symlink_to(Path("/usr/lib/cni") / plugin)
        wanted = "10-sluice.conflist" if cni == "sluice" else "10-ptp.conflist"
        # containerd 1.6 reloads on a written file (not on one moved in), and must
        # never see an empty directory: write the wanted one first, then park the rest.
        if not (node.cni_conf_dir / wanted).exists():
            (node.cni_conf_dir / wanted).write_text((parked / wanted).read_text())
        for conf in list(node.cni_conf_dir.iterdir()):
            if conf.name != wanted:
                (parked / conf.name).write_text(conf.read_text())
                conf.unlink()

        def loaded(node: Node = node) -> bool:
            info = node.containerd().crictl("info", check=False, timeout=10).stdout
            return f'"type": "{"sluice" if cni == "sluice" else "ptp"}"' in info

        deadline = time.monotonic() + 60
        while not loaded():
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd on {node.name} did not load the {cni} conflist")
            time.sleep(0.5)


def wait_no_pods(cluster: MultiNodeCluster) -> None:
    deadline = time.monotonic() + 300
    while cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name").stdout.strip():
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {NAMESPACE} still there after 300 s")
        time.sleep(1)


def one_round(cluster: MultiNodeCluster, cni: str, replicas: int) -> dict[str, Any]:
    use_cni(cluster, cni)
    nodes = cluster.nodes
    apply(cluster, *(prober_pod(n) for n in nodes))
    for node in nodes:
        cluster.kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=Ready", f"pod/prober-{node.index}",
            "--timeout=120s", timeout=130,
        )  # fmt: skip
    probers = {
        node.name: subprocess.Popen(
            [
                *("nsenter", f"--net={sandbox_netns(node, f'prober-{node.index}')}", "--"),
                *("/usr/bin/python3", "-c", PROBER, str(CLOSED_PORT)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for node in nodes
    }
    names = [n.name for n in nodes]
    ready_at: dict[str, float] = {}
    reachable_at: dict[str, float] = {}
    sent: dict[str, str] = {}  # pod ip -> the node whose prober probes it
    started = time.monotonic()
    cluster.kubectl("scale", "-n", NAMESPACE, f"deployment/{DEPLOYMENT}", f"--replicas={replicas}")
    try:
        # One reader thread per prober: select() on a buffered pipe misses lines.
        answers: queue.Queue[str] = queue.Queue()
        for prober in probers.values():
            threading.Thread(target=read_lines, args=(prober, answers), daemon=True).start()
        while len(ready_at) < replicas or len(reachable_at) < replicas:
            if time.monotonic() - started > ROUND_TIMEOUT:
                raise TimeoutError(
                    f"{cni}: {len(ready_at)} Ready, {len(reachable_at)} reachable of {replicas}"
                )
            listed = cluster.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"app={DEPLOYMENT}")
            now = time.monotonic()
            for pod in listed["items"]:
                ip = pod.get("status", {}).get("podIP")
                node = pod["spec"].get("nodeName")
                conditions = pod.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    ready_at.setdefault(pod["metadata"]["name"], now - started)
                if ip and ip not in sent and node:
                    other = names[(names.index(node) + 1) % len(names)]
                    sent[ip] = other
                    stdin = probers[other].stdin
                    assert stdin is not None
                    stdin.write(ip + "\n")
                    stdin.flush()
            deadline = time.monotonic() + 0.5
            while (left := deadline - time.monotonic()) > 0:
                try:
                    ip, at = answers.get(timeout=left).split()
                except queue.Empty:
                    break
                reachable_at.setdefault(ip, float(at) - started)
    finally:
        for prober in probers.values():
            prober.kill()
            prober.wait()
    cluster.kubectl("scale", "-n", NAMESPACE, f"deployment/{DEPLOYMENT}", "--replicas=0")
    cluster.kubectl(
        "delete", "-n", NAMESPACE, *(f"pod/prober-{n.index}" for n in nodes), "--wait=true",
        timeout=120,
    )  # fmt: skip
    wait_no_pods(cluster)
    return {
        "cni": cni,
        "all_ready_s": round(max(ready_at.values()), 2),
        "all_reachable_s": round(max(reachable_at.values()), 2),
        "p50_reachable_s": round(statistics.median(reachable_at.values()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3, help="per CNI [%(default)s]")
    parser.add_argument("--port-base", type=int, default=25000)
    parser.add_argument("--json", type=Path, help="write the rounds here")
    args = parser.parse_args()
    cluster = MultiNodeCluster(
        "bench-ps",
        nodes=args.nodes,
        port_base=args.port_base,
        install_args=["--policy=enforce"],
        routes="static",
    )
    if cluster.is_up() or cluster.control_plane.is_up():
        cluster.down()
    results: list[dict[str, Any]] = []
    with cluster:
        cluster.kubectl("create", "namespace", NAMESPACE)
        apply(cluster, deployment(0))
        for round_index in range(args.rounds):
            order = ("sluice", "ptp") if round_index % 2 == 0 else ("ptp", "sluice")
            for cni in order:
                result = one_round(cluster, cni, args.replicas)
                result["round"] = round_index
                results.append(result)
                print(json.dumps(result), flush=True)
        use_cni(cluster, "sluice")  # the harness's down removes pods through its own CNI
    summary = {}
    for cni in ("sluice", "ptp"):
        mine = [r for r in results if r["cni"] == cni]
        summary[cni] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("all_ready_s", "all_reachable_s", "p50_reachable_s")
        }
    ratios = {key: round(summary["sluice"][key] / summary["ptp"][key], 2) for key in summary["ptp"]}
    print(f"\n{args.replicas} pods on {args.nodes} nodes, median of {args.rounds} rounds each")
    print(f"{'':22}{'sluice':>10}{'ptp':>10}{'ratio':>8}")
    for key in ("all_ready_s", "all_reachable_s", "p50_reachable_s"):
        print(
            f"{key:22}{summary['sluice'][key]:>10.2f}{summary['ptp'][key]:>10.2f}"
            f"{ratios[key]:>8.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"rounds": results, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
