"""Services as kube-proxy writes them, for tests: iptables nat rules in its
iptables mode's shape, or a table in its nftables mode's shape.

A services chain jumped from PREROUTING and OUTPUT, one chain per Service
matching its ClusterIP and TCP port 80, a random choice between endpoint
chains, each DNATing to a backend and marking hairpin traffic (a backend
reaching itself through its Service) for masquerading. ``cleanup`` removes
everything the object added.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

MARK = "0x4000/0x4000"


@dataclass
class KubeProxy:
    """iptables nat rules in kube-proxy's shape, removed by ``cleanup``."""

    tag: str
    services: dict[str, tuple[str, int, list[tuple[str, int]]]] = field(default_factory=dict)
    nat_existed: bool = True

    @property
    def top(self) -> str:
        return f"KUBE-SERVICES-{self.tag}"

    @property
    def post(self) -> str:
        return f"KUBE-POSTROUTING-{self.tag}"

    @property
    def mark(self) -> str:
        return f"KUBE-MARK-MASQ-{self.tag}"

    def ipt(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["iptables", "-w", "-t", "nat", *args], capture_output=True, text=True, check=check
        )

    def setup(self) -> None:
        self.nat_existed = (
            subprocess.run(["nft", "list", "table", "ip", "nat"], capture_output=True).returncode
            == 0
        )
        for chain in (self.top, self.post, self.mark):
            self.ipt("-N", chain)
        self.ipt("-A", self.mark, "-j", "MARK", "--set-xmark", MARK)
        self.ipt("-A", self.post, "-m", "mark", "!", "--mark", MARK, "-j", "RETURN")
        self.ipt("-A", self.post, "-j", "MARK", "--set-xmark", "0x4000/0")
        self.ipt("-A", self.post, "-j", "MASQUERADE", "--random-fully")
        self.ipt("-I", "PREROUTING", "-j", self.top)
        self.ipt("-I", "OUTPUT", "-j", self.top)
        self.ipt("-I", "POSTROUTING", "-j", self.post)

    def service(self, name: str, cluster_ip: str, backends: list[tuple[str, int]]) -> None:
        svc = f"KUBE-SVC-{self.tag}-{name}"
        self.ipt("-N", svc)
        self.ipt("-A", self.top, "-d", f"{cluster_ip}/32", "-p", "tcp", "--dport", "80",
                 "-j", svc)  # fmt: skip
        for i, (ip, port) in enumerate(backends):
            sep = f"KUBE-SEP-{self.tag}-{name}{i}"
            self.ipt("-N", sep)
            self.ipt("-A", sep, "-s", f"{ip}/32", "-j", self.mark)
            self.ipt("-A", sep, "-p", "tcp", "-j", "DNAT", "--to-destination", f"{ip}:{port}")
            left = len(backends) - i
            if left > 1:
                self.ipt("-A", svc, "-m", "statistic", "--mode", "random", "--probability",
                         f"{1 / left:.5f}", "-j", sep)  # fmt: skip
            else:
                self.ipt("-A", svc, "-j", sep)
        self.services[name] = (cluster_ip, 80, backends)

    def cleanup(self) -> None:
        for hook, chain in (("PREROUTING", self.top), ("OUTPUT", self.top),
                            ("POSTROUTING", self.post)):  # fmt: skip
            while self.ipt("-D", hook, "-j", chain, check=False).returncode == 0:
                pass
        listed = self.ipt("-S", check=False).stdout.split()
        ours = sorted({w for w in listed if w.endswith(self.tag) or f"-{self.tag}-" in w})
        for chain in ours:
            self.ipt("-F", chain, check=False)
        for chain in ours:
            self.ipt("-X", chain, check=False)
        if not self.nat_existed:
            rules = self.ipt("-S", check=False).stdout.splitlines()
            if all(line.startswith("-P ") for line in rules):
                subprocess.run(["nft", "delete", "table", "ip", "nat"], check=False)


@dataclass
class NftKubeProxy:
    """The same Services as kube-proxy's nftables mode writes them, in a table of their
    own (``cleanup`` deletes it)."""

    tag: str

    @property
    def table(self) -> str:
        return f"slt-kube-proxy-{self.tag.lower()}"

    def nft(self, script: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)

    def setup(self) -> None:
        self.nft(
            f"""table ip {self.table} {{
  chain mark-for-masquerade {{ meta mark set meta mark | 0x4000; }}
  chain masquerading {{
    meta mark & 0x4000 == 0 return
    meta mark set meta mark ^ 0x4000
    masquerade fully-random
  }}
  chain services {{ }}
  chain nat-prerouting {{ type nat hook prerouting priority dstnat; jump services; }}
  chain nat-output {{ type nat hook output priority -100; jump services; }}
  chain nat-postrouting {{ type nat hook postrouting priority srcnat; jump masquerading; }}
}}"""
        )

    def service(self, name: str, cluster_ip: str, backends: list[tuple[str, int]]) -> None:
        t, svc = self.table, f"service-{name.lower()}"
        lines = [f"add chain ip {t} {svc}"]
        for i, (ip, port) in enumerate(backends):
            ep = f"endpoint-{name.lower()}-{i}"
            lines += [
                f"add chain ip {t} {ep}",
                f"add rule ip {t} {ep} ip saddr {ip} jump mark-for-masquerade",
                f"add rule ip {t} {ep} meta l4proto tcp dnat to {ip}:{port}",
            ]
        choices = ", ".join(f"{i} : goto endpoint-{name.lower()}-{i}" for i in range(len(backends)))
        lines += [
            f"add rule ip {t} {svc} numgen random mod {len(backends)} vmap {{ {choices} }}",
            f"add rule ip {t} services ip daddr {cluster_ip} tcp dport 80 goto {svc}",
        ]
        self.nft("\n".join(lines) + "\n")

    def cleanup(self) -> None:
        subprocess.run(["nft", "delete", "table", "ip", self.table], check=False,
                       capture_output=True)  # fmt: skip
