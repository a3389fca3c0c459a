"""What a cluster changes on the host outside its own directory, and undoing it.

``HostSnapshot`` is taken before anything starts and kept in the state file; the
cleanup functions use it to remove only what the cluster added: iptables chains
named ``KUBE-*`` (kube-proxy's and the kubelet's), nftables tables that did not
exist before and hold no rules any more, sysctls the kubelet or kube-proxy changed,
directories Kubernetes insists on creating, conntrack entries of the cluster's
ranges and the kubelet's cgroups.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.containerd import remove_cgroup_tree

# Paths the kubelet, kube-apiserver, containerd's shims and libcni create whatever
# their flags say.
HOST_PATHS = (
    Path("/run/containerd"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/run/kubernetes"),
    Path("/var/lib/kubelet"),
    Path("/usr/libexec/kubernetes"),
    Path("/etc/kubernetes"),
    Path("/var/lib/cni"),
)
# Sysctls the kubelet (protectKernelDefaults off) and kube-proxy may set.
SYSCTLS = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
)
IPTABLES = ("iptables", "ip6tables")
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")
# Tables iptables-nft creates on first use, and kube-proxy's nftables tables.
NFT_TABLES_KUBERNETES_MAY_CREATE = {
    *((family, table) for family in ("ip", "ip6") for table in IPTABLES_TABLES),
    ("ip", "kube-proxy"),
    ("ip6", "kube-proxy"),
}
KUBE_CHAIN_RE = re.compile(r"^KUBE-")


def run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class HostSnapshot:
    nft_tables: list[list[str]] = field(default_factory=list)
    missing_paths: list[str] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)

    @classmethod
    def take(cls) -> HostSnapshot:
        sysctls = {}
        for name in SYSCTLS:
            with contextlib.suppress(OSError):
                sysctls[name] = (Path("/proc/sys") / name).read_text().strip()
        missing = [str(p) for p in HOST_PATHS if not p.exists()]
        return cls([list(t) for t in nft_tables()], missing, sysctls)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostSnapshot:
        return cls(**data)


# --- nftables and iptables -----------------------------------------------------------


def nft_tables() -> set[tuple[str, str]]:
    out = run(["nft", "-j", "list", "tables"]).stdout
    items = json.loads(out or "{}").get("nftables", [])
    return {(i["table"]["family"], i["table"]["name"]) for i in items if "table" in i}


def nft_rule_count(family: str, table: str) -> int:
    out = run(["nft", "-j", "list", "table", family, table]).stdout
    return sum(1 for item in json.loads(out or "{}").get("nftables", []) if "rule" in item)


def remove_new_nft_tables(before: HostSnapshot) -> list[str]:
    """Delete tables Kubernetes may have created that were absent before and are empty."""
    existed = {tuple(t) for t in before.nft_tables}
    removed = []
    for family, table in sorted(nft_tables() - existed):
        if (family, table) in NFT_TABLES_KUBERNETES_MAY_CREATE and not nft_rule_count(
            family, table
        ):
            run(["nft", "delete", "table", family, table])
            removed.append(f"{family} {table}")
    return removed


def kube_iptables_chains() -> list[str]:
    """``<command> <table> <chain>`` for every KUBE-* chain left in iptables/ip6tables."""
    found = []
    for command in IPTABLES:
        for table in IPTABLES_TABLES:
            for line in run([command, "-w", "-t", table, "-S"]).stdout.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "-N" and KUBE_CHAIN_RE.match(parts[1]):
                    found.append(f"{command} {table} {parts[1]}")
    return found


def remove_kube_iptables_chains() -> None:
    """Delete every rule that jumps to a KUBE-* chain, then flush and delete those chains."""
    for command in IPTABLES:
        for table in IPTABLES_TABLES:
            rules = run([command, "-w", "-t", table, "-S"]).stdout.splitlines()
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            if not chains:
                continue
            for rule in rules:
                parts = shlex.split(rule)
                in_other_chain = parts[:1] == ["-A"] and not KUBE_CHAIN_RE.match(parts[1])
                if in_other_chain and any(KUBE_CHAIN_RE.match(p) for p in parts[2:]):
                    run([command, "-w", "-t", table, "-D", *parts[1:]])
            for chain in chains:
                run([command, "-w", "-t", table, "-F", chain])
            for chain in chains:
                run([command, "-w", "-t", table, "-X", chain])


# --- conntrack, sysctls, directories, cgroups ---------------------------------------


def conntrack_entries(cidrs: list[str]) -> list[str]:
    """Conntrack entries whose original or reply addresses fall in ``cidrs``."""
    lines: set[str] = set()
    for cidr in cidrs:
        for flag in ("--orig-src", "--orig-dst", "--reply-src", "--reply-dst"):
            out = run(["conntrack", "-L", flag, cidr]).stdout
            lines.update(line for line in out.splitlines() if line.strip())
    return sorted(lines)


def flush_conntrack(cidrs: list[str]) -> None:
    for cidr in cidrs:
        for flag in ("--orig-src", "--orig-dst", "--reply-src", "--reply-dst"):
            run(["conntrack", "-D", flag, cidr])


def restore_sysctls(before: HostSnapshot) -> None:
    for name, value in before.sysctls.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def remove_created_paths(before: HostSnapshot, owned_by: Path) -> None:
    """Remove the host directories that did not exist before, once they are empty.

    /var/log/containers only holds the kubelet's symlinks; those pointing into the
    cluster's directory are removed first.
    """
    containers_logs = Path("/var/log/containers")
    if containers_logs.is_dir():
        for link in containers_logs.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(owned_by)):
                link.unlink()
    # Deepest first; rmdir only succeeds on what is empty (others may use them too).
    for top in sorted(before.missing_paths, key=lambda p: len(Path(p).parts), reverse=True):
        if Path(top).is_dir() and not Path(top).is_symlink():
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _cgroup_hierarchies() -> list[Path]:
    out = run(["findmnt", "-rn", "-t", "cgroup,cgroup2", "-o", "TARGET"]).stdout
    return [Path(h) for h in out.split()]


def create_cgroups(cgroup_root: str) -> None:
    """The kubelet refuses a ``cgroupRoot`` that does not exist in every hierarchy."""
    for hierarchy in _cgroup_hierarchies():
        (hierarchy / cgroup_root.lstrip("/")).mkdir(exist_ok=True)


def remove_cgroups(cgroup_root: str) -> None:
    remove_cgroup_tree(cgroup_root)


def cgroup_dirs(cgroup_root: str) -> list[str]:
    paths = [h / cgroup_root.lstrip("/") for h in _cgroup_hierarchies()]
    return [str(p) for p in paths if p.is_dir()]
