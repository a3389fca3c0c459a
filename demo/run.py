#!/usr/bin/env python3
"""sluice end to end on this machine: the agent, three pods in two namespaces, a
NetworkPolicy applied with sluicectl, and what it changes.

1. install sluice into a scratch directory ("policy": "enforce") and start
   ``sluicectl agent``;
2. wire pods shop/web, shop/db and ops/monitor through the real plugin (which
   forwards to the agent), each serving TCP on 80 and 5432;
3. print who reaches whom, apply conf/demo-policy.yaml with ``sluicectl
   apply``, print it again;
4. ``sluicectl explain`` for a denied flow, the deny events the datapath
   reported while the matrix with the policy ran (the pods' own IPv6
   frames, which the datapath drops too, are among them), and the agent's
   view of endpoints and policies;
5. remove everything again.

Exit status 1 if any connection differs from what the policy says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from cni.spec.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
SLUICECTL = str(ROOT / ".venv" / "bin" / "sluicectl")
PROBE = str(ROOT / "tests" / "harness" / "matrix_probe.py")
SERVER = str(ROOT / "tests" / "harness" / "netprobe.py")
POLICY = ROOT / "conf" / "demo-policy.yaml"
SUBNET = "10.244.77.0/24"
PODS = (("shop", "web"), ("shop", "db"), ("ops", "monitor"))
PORTS = (80, 5432)
# With the policy: db takes only web, and only on its named port postgres (5432).
DENIED = {
    ("shop/web", "shop/db", 80),
    ("ops/monitor", "shop/db", 80),
    ("ops/monitor", "shop/db", 5432),
}


def sluicectl(*args: str, check: bool = True) -> str:
    proc = subprocess.run([SLUICECTL, *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        sys.exit(f"sluicectl {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def shown(title: str, *args: str) -> None:
    """Run sluicectl and print the command and its output, indented."""
    print(f"\n{title}")
    print("  " + sluicectl(*args, check=False).strip().replace("\n", "\n  "))


def cni(bin_dir: Path, command: str, config: dict, pod: dict) -> dict:
    env = cni_env(
        command,
        container_id=pod["id"],
        netns=f"/run/netns/{pod['netns']}" if command == "ADD" else "",
        ifname="eth0",
        cni_path=str(bin_dir),
        cni_args=(
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod['namespace']};K8S_POD_NAME={pod['name']}"
        ),
        base={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin")},
    )
    run = invoke(str(bin_dir / "sluice"), env, config)
    if run.rc != 0:
        sys.exit(f"CNI {command} failed: {run.stdout}{run.stderr}")
    return run.out or {}


def matrix(pods: list[dict]) -> dict[tuple[str, str, int], bool]:
    targets = [(p["ip"], port, "tcp") for p in pods for port in PORTS]
    found = {}
    for source in pods:
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                source["netns"],
                "/usr/bin/python3",
                PROBE,
                json.dumps(targets),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for (ip, port, _), ok in zip(targets, json.loads(out), strict=True):
            target = next(p for p in pods if p["ip"] == ip)
            found[(source["key"], target["key"], port)] = ok
    return found


def show(found: dict[tuple[str, str, int], bool], denied: set[tuple[str, str, int]]) -> int:
    wrong = 0
    keys = sorted({s for s, _, _ in found})
    header = "".join(f"{f'{t}:{p}':>18}" for t in keys for p in PORTS)
    print(f"  {'from / to':<14}{header}")
    for source in keys:
        cells = []
        for target in keys:
            for port in PORTS:
                ok = found[(source, target, port)]
                expected = (source, target, port) not in denied
                wrong += ok != expected
                cells.append(f"{'ok' if ok else 'DENIED'}{'' if ok == expected else ' (!)':>4}")
        print(f"  {source:<14}" + "".join(f"{c:>18}" for c in cells))
    return wrong


def events_since(output: str, since: datetime) -> list[str]:
    """The monitor's lines (each starts with the event's UTC time) from ``since`` on:
    the pods' earlier frames, from when their interfaces came up, are left out."""
    kept = []
    for line in output.splitlines():
        clock = datetime.strptime(line.split(" ", 1)[0], "%H:%M:%S.%f").time()
        if datetime.combine(since.date(), clock, UTC) >= since:
            kept.append(line)
    return kept


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("the demo needs root: it creates network namespaces")
    work = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    work.chmod(0o700)
    bin_dir, conf_dir = work / "bin", work / "net.d"
    network = f"demo-{uuid.uuid4().hex[:6]}"
    bpf_dir = f"/sys/fs/bpf/sluice-demo-{uuid.uuid4().hex[:6]}"
    sluicectl(
        "install",
        *("--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir), "--name", network),
        *("--subnet", SUBNET, "--state-dir", str(work / "state"), "--bpf-dir", bpf_dir),
        *("--agent-socket", str(work / "run" / "agent.sock"), "--policy", "enforce"),
    )
    conf = str(conf_dir / "10-sluice.conflist")
    conflist = json.loads(Path(conf).read_text())
    config = {**conflist["plugins"][0], "name": network, "cniVersion": conflist["cniVersion"]}

    print("starting the agent (it compiles and pins the eBPF datapath) ...")
    agent_log = (work / "agent.log").open("wb")
    agent = subprocess.Popen(
        [SLUICECTL, "agent", "--conf", conf], stdout=agent_log, stderr=agent_log
    )
    pods: list[dict] = []
    servers: list[subprocess.Popen[str]] = []
    wrong = 0
    try:
        deadline = time.monotonic() + 120
        status = [SLUICECTL, "status", "--conf", conf, "--bin-dir", str(bin_dir)]
        while subprocess.run(status, capture_output=True, check=False).returncode != 0:
            if agent.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the agent did not start:\n{(work / 'agent.log').read_text()}")
            time.sleep(0.2)
        for namespace, name in PODS:
            pod = {
                "namespace": namespace,
                "name": name,
                "key": f"{namespace}/{name}",
                "netns": f"sluice-demo-{name}-{uuid.uuid4().hex[:4]}",
                "id": f"demo-{name}-{uuid.uuid4().hex[:8]}",
            }
            subprocess.run(["ip", "netns", "add", pod["netns"]], check=True)
            subprocess.run(["ip", "-n", pod["netns"], "link", "set", "lo", "up"], check=True)
            pods.append(pod)
            started = time.perf_counter()
            result = cni(bin_dir, "ADD", config, pod)
            pod["ms"] = (time.perf_counter() - started) * 1000
            pod["ip"] = result["ips"][0]["address"].split("/")[0]
            in_pod = ["ip", "netns", "exec", pod["netns"], "/usr/bin/python3"]
            server = subprocess.Popen(
                [*in_pod, SERVER, "serve", "--tcp", ",".join(map(str, PORTS))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"

        print(f"\nnetwork {network!r}, subnet {SUBNET}, datapath {bpf_dir}")
        for pod in pods:
            print(f"  {pod['key']:<13} {pod['ip']:<14} ADD through the agent: {pod['ms']:.0f} ms")

        print("\nwho reaches whom (TCP), no policy yet:")
        wrong += show(matrix(pods), set())

        print(f"\nsluicectl apply -f {POLICY.relative_to(ROOT)}")
        print("  " + sluicectl("apply", "--conf", conf, "-f", str(POLICY)).replace("\n", "\n  "))
        print("who reaches whom (TCP), with the policy:")
        since = datetime.now(UTC)
        wrong += show(matrix(pods), DENIED)

        monitor = pods[2]["ip"]
        flow = f"{monitor}:5432/tcp"
        explain = ("explain", "shop/db", "--conf", conf)
        shown(f"sluicectl explain shop/db --from {flow}", *explain, "--from", flow)
        shown("sluicectl explain shop/db", *explain)
        watch = ("datapath", "monitor", "--conf", conf, "--backlog", "--timeout", "0.5")
        print(f"\ndeny events since {since:%H:%M:%S} (sluicectl datapath monitor --backlog):")
        for line in events_since(sluicectl(*watch), since):
            print(f"  {line}")
        shown("sluicectl get endpoints -o wide", "get", "endpoints", "--conf", conf, "-o", "wide")
        shown("sluicectl get policies", "get", "policies", "--conf", conf)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for pod in pods:
            cni(bin_dir, "DEL", config, pod)
            subprocess.run(["ip", "netns", "del", pod["netns"]], check=False)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        subprocess.run(
            ["nft", "delete", "table", "ip", f"sluice_{network}"], check=False, capture_output=True
        )
        shutil.rmtree(bpf_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nremoved {len(pods)} pods (veths, routes, masquerade entries, datapath entries, "
        "addresses), stopped the agent, unpinned the datapath"
    )
    if wrong:
        sys.exit(f"{wrong} connections differ from what the policy says")


if __name__ == "__main__":
    main()
