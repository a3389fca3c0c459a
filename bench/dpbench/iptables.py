"""The iptables baseline: the same rules as a FORWARD chain every packet into the
server pod walks (no ESTABLISHED shortcut), ending in a DROP."""

from __future__ import annotations

import subprocess

from dpbench.configs import BENCH_PORTS, other_peers
from dpbench.plumbing import run


class Chain:
    def __init__(self, name: str) -> None:
        self.name = name
        self.veth = ""
        self.filter_table_existed = True
        self.counts = [0, 0]  # packets of the matching ACCEPT and the final DROP

    def add(self, n: int, veth: str, client_ip: str) -> None:
        """n rules, the last one allowing the client, jumped to for packets out of veth."""
        self.veth = veth
        self.filter_table_existed = self.nft_has_filter_table()
        lines = ["*filter", f":{self.name} - [0:0]"]
        lines += [
            f"-A {self.name} -s {address}/32 -p tcp -m tcp --dport {port} -j ACCEPT"
            for address, port in other_peers(n - 1)
        ]
        lines += [
            f"-A {self.name} -s {client_ip}/32 -p tcp -m tcp "
            f"--dport {min(BENCH_PORTS)}:{max(BENCH_PORTS)} -j ACCEPT",
            f"-A {self.name} -j DROP",  # an isolated pod: what no rule allows drops
            f"-I FORWARD 1 -o {veth} -j {self.name}",
            "COMMIT",
            "",
        ]
        proc = subprocess.run(
            ["iptables-restore", "--noflush"],
            input="\n".join(lines),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            self.remove()
            raise RuntimeError(f"iptables-restore failed: {proc.stderr}")
        listed = run(["iptables", "-S", self.name]).stdout.count(f"-A {self.name} ")
        if listed != n + 1:
            raise RuntimeError(f"{self.name} holds {listed} rules, expected {n + 1}")

    def remove(self) -> None:
        """The jump, the chain, and the filter table if this benchmark brought it."""
        jump = ["iptables", "-D", "FORWARD", "-o", self.veth, "-j", self.name]
        while self.veth and run(jump, check=False).returncode == 0:
            pass
        if run(["iptables", "-S", self.name], check=False).returncode == 0:
            run(["iptables", "-F", self.name])
            run(["iptables", "-X", self.name])
        if not self.filter_table_existed and self.nft_has_filter_table():
            rules = run(["iptables", "-S"]).stdout.splitlines()
            if all(line.startswith("-P ") for line in rules):
                run(["nft", "delete", "table", "ip", "filter"], check=False)
        self.filter_table_existed = True

    @staticmethod
    def nft_has_filter_table() -> bool:
        return run(["nft", "list", "table", "ip", "filter"], check=False).returncode == 0

    def counters(self) -> tuple[int, int]:
        """Packets of the matching ACCEPT rule and of the final DROP."""
        rows = run(["iptables", "-L", self.name, "-v", "-x", "-n"]).stdout.splitlines()[2:]
        accept, drop = rows[-2].split(), rows[-1].split()
        if accept[2] != "ACCEPT" or drop[2] != "DROP":
            raise RuntimeError(f"unexpected tail of {self.name}: {rows[-2:]}")
        return int(accept[0]), int(drop[0])
