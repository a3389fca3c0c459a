#!/usr/bin/env python3
"""sluice demo: three pods on this node, wired by the real plugin, then removed.

Installs the plugin into a scratch CNI directory with `sluicectl install`,
creates three pod network namespaces and runs the CNI ADD for each exactly
as a runtime would (the first ADD compiles and pins the eBPF datapath),
shows the pods, proves that pods reach each other and the node reaches
them, then programs one policy through the datapath API (db accepts only
api) and shows the denied probe, the deny event and the counters. Finally
it removes everything again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from cni.invoke import cni_env, invoke

ROOT = Path(__file__).resolve().parent.parent
SLUICECTL = ROOT / ".venv" / "bin" / "sluicectl"
SUBNET = "10.244.77.0/24"


def sh(*command: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=check)


def cni(bin_dir: Path, command: str, config: dict, container_id: str, netns: str) -> dict:
    env = cni_env(
        command,
        container_id=container_id,
        netns=netns,
        ifname="eth0",
        cni_path=str(bin_dir),
        base={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin")},
    )
    run = invoke(str(bin_dir / "sluice"), env, config)
    if run.rc != 0:
        sys.exit(f"CNI {command} failed: {run.stdout}{run.stderr}")
    return run.out or {}


def ping(netns: str | None, address: str) -> bool:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return sh(*prefix, "ping", "-c", "1", "-W", "1", address, check=False).returncode == 0


def reachability(pods: list[dict[str, str]]) -> list[tuple[str, str, bool]]:
    results = []
    for source in pods:
        for target in pods:
            if source is not target:
                results.append(
                    (source["name"], target["name"], ping(source["netns"], target["ip"]))
                )
    results += [("node", target["name"], ping(None, target["ip"])) for target in pods]
    return results


def show(results: list[tuple[str, str, bool]], expected_denied: set[tuple[str, str]]) -> int:
    wrong = 0
    for source, target, ok in results:
        denied = (source, target) in expected_denied
        wrong += ok == denied
        verdict = "ok" if ok else "denied"
        note = "" if ok != denied else "   <-- unexpected"
        print(f"  {source:<5} -> {target:<4} {verdict}{note}")
    return wrong


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("the demo needs root: it creates network namespaces")
    work = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    bin_dir, conf_dir = work / "bin", work / "net.d"
    network = f"demo-{uuid.uuid4().hex[:6]}"
    bpf_dir = f"/sys/fs/bpf/sluice-demo-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [
            SLUICECTL,
            "install",
            "--bin-dir",
            bin_dir,
            "--conf-dir",
            conf_dir,
            "--name",
            network,
            "--subnet",
            SUBNET,
            "--state-dir",
            work / "state",
            "--bpf-dir",
            bpf_dir,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    conflist = json.loads((conf_dir / "10-sluice.conflist").read_text())
    config = {**conflist["plugins"][0], "name": network, "cniVersion": conflist["cniVersion"]}

    pods: list[dict[str, str]] = []
    wrong = 0
    try:
        print("creating pods web, api, db (the first ADD compiles the eBPF datapath) ...")
        for name in ("web", "api", "db"):
            netns = f"sluice-demo-{name}-{uuid.uuid4().hex[:4]}"
            sh("ip", "netns", "add", netns)
            pod = {"name": name, "netns": netns, "id": f"demo-{name}-{uuid.uuid4().hex[:8]}"}
            pods.append(pod)
            result = cni(bin_dir, "ADD", config, pod["id"], f"/run/netns/{netns}")
            pod["ip"] = result["ips"][0]["address"].split("/")[0]
            pod["veth"] = result["interfaces"][0]["name"]
            pod["gateway"] = result["ips"][0]["gateway"]

        print(f"\nnetwork {network!r}, subnet {SUBNET}, datapath {bpf_dir}\n")
        print(f"{'pod':<6}{'address':<15}{'gateway':<14}{'node-side veth':<16}netns")
        for pod in pods:
            print(
                f"{pod['name']:<6}{pod['ip']:<15}{pod['gateway']:<14}{pod['veth']:<16}"
                f"{pod['netns']}"
            )

        print("\nreachability, no policy:")
        wrong += show(reachability(pods), set())

        _, api, db = pods
        print(
            f"\nprogramming a policy through the datapath API: db ({db['ip']}) accepts "
            f"only api ({api['ip']}) ..."
        )
        install_policy(bpf_dir, db, api)
        print("reachability, with the policy:")
        wrong += show(reachability(pods), {("web", "db")})

        print("\ndeny events (sluicectl datapath monitor):")
        subprocess.run(
            [
                SLUICECTL,
                "datapath",
                "monitor",
                "--bpf-dir",
                bpf_dir,
                "--count",
                "3",
                "--backlog",
                "--timeout",
                "0.5",
            ],
            check=False,
        )
        print("\ncounters (sluicectl datapath counters):")
        subprocess.run([SLUICECTL, "datapath", "counters", "--bpf-dir", bpf_dir], check=False)
        print()
        subprocess.run([SLUICECTL, "datapath", "show", "--bpf-dir", bpf_dir], check=False)
    finally:
        for pod in pods:
            cni(bin_dir, "DEL", config, pod["id"], "")
            sh("ip", "netns", "del", pod["netns"], check=False)
        sh("nft", "delete", "table", "ip", f"sluice_{network}", check=False)
        shutil.rmtree(bpf_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nremoved {len(pods)} pods: veths, routes, masquerade entries, datapath entries "
        "and addresses released; datapath unpinned"
    )
    if wrong:
        sys.exit(f"{wrong} reachability checks differ from what the policy says")


def install_policy(bpf_dir: str, target: dict[str, str], allowed: dict[str, str]) -> None:
    from cni.datapath import policy
    from cni.datapath.maps import Datapath

    ifindex = int(Path(f"/sys/class/net/{target['veth']}/ifindex").read_text())
    only_api = policy.AllowRule(peers=(policy.PeerCIDR(f"{allowed['ip']}/32"),))
    with Datapath(bpf_dir) as datapath:
        policy.install(datapath, ifindex, policy.EndpointPolicy(ingress=(only_api,)))


if __name__ == "__main__":
    main()
