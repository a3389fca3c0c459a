"""What the test clusters read from the host before and after they run: its address
and name as a node, its routes (a cluster's ranges must not overlap them), and the
processes still naming a cluster's directory."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import socket
import subprocess
from pathlib import Path

from tests.harness.cluster_state import ClusterError


def node_address() -> str:
    """The node's address: the source of its default route."""
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "get", "1.0.0.0"], capture_output=True, text=True, check=True
    ).stdout
    routes = json.loads(out)
    if not routes or "prefsrc" not in routes[0]:
        raise ClusterError(f"cannot tell the node address from `ip route get 1.0.0.0`: {out}")
    return routes[0]["prefsrc"]


def node_name() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return name if re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name) else "sluice-node"


def host_routes() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    nets = []
    for route in json.loads(out or "[]"):
        with contextlib.suppress(ValueError):
            if route.get("dst") not in (None, "default"):
                nets.append(ipaddress.ip_network(route["dst"], strict=False))
    return nets


def processes_mentioning(text: str) -> list[str]:
    """``pid argv0`` of every process whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if int(cmdline.parent.name) != os.getpid() and any(text in a for a in argv):
                found.append(f"{cmdline.parent.name} {argv[0]}")
    return found
