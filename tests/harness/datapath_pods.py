"""Pods wired by the real plugin, for datapath tests with real packets: probing,
serving, held connections, and the policy shorthands the tests write rules with."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni.policy.vocabulary import AllowRule, PeerCIDR, Ports
from tests.harness.cni_run import Network, PodNamespaces, in_netns, node_veth

PROBE = str(Path(__file__).resolve().parent / "netprobe.py")
PYTHON = "/usr/bin/python3"


@dataclass
class Pod:
    cid: str
    netns: str
    ip: str
    veth: str
    ifindex: int

    def probe(self, *args: object, timeout: float = 20) -> int:
        return in_netns(self.netns, PYTHON, PROBE, *map(str, args), timeout=timeout).returncode

    def connects(self, peer: Pod, port: int) -> bool:
        return self.probe("connect", peer.ip, port) == 0


class Server:
    """netprobe serve in a pod: TCP echo and UDP counting until stopped."""

    def __init__(self, pod: Pod, tcp: tuple[int, ...] = (), udp: tuple[int, ...] = ()) -> None:
        command = ["ip", "netns", "exec", Path(pod.netns).name, PYTHON, PROBE, "serve"]
        if tcp:
            command += ["--tcp", ",".join(map(str, tcp))]
        if udp:
            command += ["--udp", ",".join(map(str, udp))]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        self.counts: dict[str, dict[str, int]] = {}

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> dict[str, dict[str, int]]:
        if self.proc.poll() is None:
            out, _ = self.proc.communicate(input="", timeout=20)
            self.counts = json.loads(out)
        return self.counts


class HeldConnection:
    """A TCP connection from one pod to another, echoing once now and once on ``finish``."""

    SCRIPT = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)\n"
        "s.sendall(b'1'); assert s.recv(1) == b'1'\n"
        "print('established', flush=True); sys.stdin.readline()\n"
        "s.sendall(b'2')\n"
        "try:\n    print('echo' if s.recv(1) == b'2' else 'closed')\n"
        "except OSError:\n    print('cut')\n"
    )

    def __init__(self, client: Pod, server: Pod, port: int) -> None:
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                Path(client.netns).name,
                PYTHON,
                "-c",
                self.SCRIPT,
                server.ip,
                str(port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "established"

    def finish(self) -> str:
        """'echo' if the connection still works, 'cut' if its packets are dropped."""
        out, _ = self.proc.communicate("go\n", timeout=20)
        return out.strip()


def allow(*rules: AllowRule) -> tuple[AllowRule, ...]:
    return rules


def rule(*cidrs: str, ports: tuple[Ports, ...] = (), excepts: tuple[str, ...] = ()) -> AllowRule:
    return AllowRule(peers=tuple(PeerCIDR(c, excepts) for c in cidrs), ports=ports)


def tcp(first: int, last: int = 0) -> Ports:
    return Ports("tcp", first, last)


@contextmanager
def wired_pods(
    network: Network, pods: PodNamespaces, cids: str, config: dict[str, Any] | None = None
) -> Iterator[list[Pod]]:
    """One pod per container id in ``cids``, each in its own namespace, wired by the
    plugin with ``config``; all deleted afterwards."""
    made: list[Pod] = []
    try:
        for cid in cids:
            netns = pods.new()
            result = network.add(netns, cid, config=config)
            veth, ifindex = node_veth(result)
            made.append(Pod(cid, netns, result["ips"][0]["address"].split("/")[0], veth, ifindex))
        yield made
    finally:
        for pod in made:
            network.delete(pod.netns, pod.cid, config=config)
