#!/usr/bin/env python3
"""sluice demo: three pods on this node, wired by the real plugin, then removed.

Installs the plugin into a scratch CNI directory with `sluicectl install`,
creates three pod network namespaces, runs the CNI ADD for each exactly as
a runtime would, shows the pods, proves that pods reach each other and the
node reaches them, and cleans everything up again.
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

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.244.77.0/24"


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=check)


def cni(bin_dir: Path, command: str, config: dict, container_id: str, netns: str) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(bin_dir),
    }
    proc = subprocess.run(
        [bin_dir / "sluice"],
        input=json.dumps(config),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"CNI {command} failed: {proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def ping(netns: str | None, address: str) -> bool:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return sh(*prefix, "ping", "-c", "1", "-W", "2", address, check=False).returncode == 0


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("the demo needs root: it creates network namespaces")
    work = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    bin_dir, conf_dir = work / "bin", work / "net.d"
    network = f"demo-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [
            ROOT / ".venv" / "bin" / "sluicectl",
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
        ],
        check=True,
    )
    conflist = json.loads((conf_dir / "10-sluice.conflist").read_text())
    config = {**conflist["plugins"][0], "name": network, "cniVersion": conflist["cniVersion"]}

    pods: list[dict[str, str]] = []
    failures = 0
    try:
        for name in ("web", "api", "db"):
            netns = f"sluice-demo-{name}-{uuid.uuid4().hex[:4]}"
            sh("ip", "netns", "add", netns)
            pod = {"name": name, "netns": netns, "id": f"demo-{name}-{uuid.uuid4().hex[:8]}"}
            pods.append(pod)
            result = cni(bin_dir, "ADD", config, pod["id"], f"/run/netns/{netns}")
            pod["ip"] = result["ips"][0]["address"]
            pod["veth"] = result["interfaces"][0]["name"]
            pod["gateway"] = result["ips"][0]["gateway"]

        print(f"\nnetwork {network!r}, subnet {SUBNET}, plugin {bin_dir / 'sluice'}\n")
        print(f"{'pod':<6}{'address':<18}{'gateway':<14}{'node-side veth':<16}netns")
        for pod in pods:
            print(
                f"{pod['name']:<6}{pod['ip']:<18}{pod['gateway']:<14}{pod['veth']:<16}"
                f"{pod['netns']}"
            )

        print()
        for source in pods:
            for target in pods:
                if source is target:
                    continue
                ok = ping(source["netns"], target["ip"].split("/")[0])
                failures += not ok
                print(
                    f"pod {source['name']:<4} -> pod {target['name']:<4} {'ok' if ok else 'FAILED'}"
                )
        for target in pods:
            ok = ping(None, target["ip"].split("/")[0])
            failures += not ok
            print(f"node     -> pod {target['name']:<4} {'ok' if ok else 'FAILED'}")
        print()
        subprocess.run(
            [
                ROOT / ".venv" / "bin" / "sluicectl",
                "status",
                "--conf",
                conf_dir / "10-sluice.conflist",
                "--bin-dir",
                bin_dir,
            ],
            check=False,
        )
    finally:
        for pod in pods:
            cni(bin_dir, "DEL", config, pod["id"], "")
            sh("ip", "netns", "del", pod["netns"], check=False)
        subprocess.run(
            ["nft", "delete", "table", "ip", f"sluice_{network}"], capture_output=True, check=False
        )
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nremoved {len(pods)} pods: veths, routes, masquerade entries and addresses released")
    if failures:
        sys.exit(f"{failures} reachability checks failed")


if __name__ == "__main__":
    main()
