"""What a Docker daemon changes on the host, captured before it starts and put back after.

Measured with Debian's dockerd 20.10 on this machine:

* with its defaults it adds the ``DOCKER``, ``DOCKER-USER`` and
  ``DOCKER-ISOLATION-STAGE-1/2`` chains, jumps to them from ``FORWARD`` and (nat)
  ``PREROUTING`` and ``OUTPUT``, ``FORWARD`` accepts and a ``POSTROUTING``
  ``MASQUERADE`` per network, and the ``docker0`` bridge, and leaves all of them
  behind when it stops; the ``FORWARD`` policy stayed ``ACCEPT`` (Docker turns it
  to ``DROP`` only when it has to enable ``net.ipv4.ip_forward`` itself);
* the project's own daemon runs without iptables rules and without ``docker0``
  (``tests/harness/dockerd.py``), so what is left is a ``br-<id>`` bridge per
  network, and ``net.ipv6.conf.all.forwarding`` turned on by the first network
  with IPv6.

``HostSnapshot.capture()`` records the sysctls a daemon may turn and the Docker
bridges, chains and rules present before it starts; ``restore()`` removes whatever
Docker-looking object appeared since and sets the sysctls back. Objects that other
programs create meanwhile (other tests' veths, kube-proxy's chains) are never
touched: only names Docker uses are considered.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/bridge/bridge-nf-call-arptables",
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
BUILTIN_POLICIES = ("FORWARD",)

DOCKER_BRIDGE_RE = re.compile(r"^(docker0|br-[0-9a-f]{12})$")
DOCKER_CHAIN_RE = re.compile(r"\bDOCKER[\w-]*")
DOCKER_IFACE_RE = re.compile(r"\b(docker0|br-[0-9a-f]{12})\b")


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def docker_bridges() -> list[str]:
    """Bridges named as Docker names them (``docker0``, ``br-<network id>``)."""
    out = _run(["ip", "-j", "link", "show", "type", "bridge"]).stdout or "[]"
    names = (link["ifname"] for link in json.loads(out))
    return sorted(name for name in names if DOCKER_BRIDGE_RE.match(name))


def _save(tool: str, table: str) -> list[str]:
    proc = _run([f"{tool}-save", "-t", table])
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def docker_rules() -> dict[str, list[str]]:
    """``tool/table`` -> the saved lines that name a Docker chain or a Docker bridge."""
    found: dict[str, list[str]] = {}
    for tool in IPTABLES:
        for table in TABLES:
            lines = [
                # A chain line's counters change; its name is what matters.
                line.split()[0] if line.startswith(":") else line
                for line in _save(tool, table)
                if line.startswith((":", "-A"))
                and (DOCKER_CHAIN_RE.search(line) or DOCKER_IFACE_RE.search(line))
            ]
            if lines:
                found[f"{tool}/{table}"] = lines
    return found


def forward_policies() -> dict[str, str]:
    policies: dict[str, str] = {}
    for tool in IPTABLES:
        for line in _save(tool, "filter"):
            if line.startswith(":FORWARD "):
                policies[tool] = line.split()[1]
    return policies


@dataclass
class HostSnapshot:
    sysctls: dict[str, str | None] = field(default_factory=dict)
    bridges: list[str] = field(default_factory=list)
    rules: dict[str, list[str]] = field(default_factory=dict)
    forward_policy: dict[str, str] = field(default_factory=dict)

    @classmethod
    def capture(cls) -> HostSnapshot:
        return cls(
            sysctls={name: _read_sysctl(name) for name in SYSCTLS},
            bridges=docker_bridges(),
            rules=docker_rules(),
            forward_policy=forward_policies(),
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> HostSnapshot:
        return cls(**data)  # type: ignore[arg-type]

    def differences(self) -> list[str]:
        """What differs now from this snapshot, in Docker's objects and the sysctls."""
        now = HostSnapshot.capture()
        diffs = [
            f"sysctl {name}: {self.sysctls.get(name)} -> {value}"
            for name, value in now.sysctls.items()
            if value != self.sysctls.get(name)
        ]
        diffs += [f"bridge {b} appeared" for b in now.bridges if b not in self.bridges]
        for key, lines in now.rules.items():
            before = set(self.rules.get(key, []))
            diffs += [f"{key}: {line}" for line in lines if line not in before]
        diffs += [
            f"{tool} FORWARD policy: {self.forward_policy.get(tool)} -> {policy}"
            for tool, policy in now.forward_policy.items()
            if policy != self.forward_policy.get(tool)
        ]
        return diffs

    def restore(self) -> list[str]:
        """Undo what appeared since the snapshot; return what was done (and what failed)."""
        done: list[str] = []
        done += self._remove_rules()
        for bridge in docker_bridges():
            if bridge not in self.bridges:
                proc = _run(["ip", "link", "delete", bridge])
                done.append(f"deleted bridge {bridge}" + _failure(proc))
        for tool, policy in forward_policies().items():
            wanted = self.forward_policy.get(tool)
            if wanted and wanted != policy:
                proc = _run([tool, "-P", "FORWARD", wanted])
                done.append(f"{tool} FORWARD policy {policy} -> {wanted}" + _failure(proc))
        for name, value in self.sysctls.items():
            current = _read_sysctl(name)
            if value is not None and current != value:
                try:
                    Path("/proc/sys", name).write_text(value)
                    done.append(f"sysctl {name}: {current} -> {value}")
                except OSError as err:
                    done.append(f"sysctl {name}: could not set {value} back ({err})")
        return done

    def _remove_rules(self) -> list[str]:
        done: list[str] = []
        for key, lines in docker_rules().items():
            tool, table = key.split("/")
            before = set(self.rules.get(key, []))
            new_rules = [line for line in lines if line.startswith("-A") and line not in before]
            for line in new_rules:
                argv = [tool, "-t", table, "-D", *shlex.split(line)[1:]]
                proc = _run(argv)
                done.append(f"{tool} -t {table} {line}: removed" + _failure(proc))
            new_chains = [
                line[1:]
                for line in lines
                if line.startswith(":") and line not in before and DOCKER_CHAIN_RE.match(line[1:])
            ]
            for chain in new_chains:
                with contextlib.suppress(subprocess.SubprocessError):
                    _run([tool, "-t", table, "-F", chain])
                proc = _run([tool, "-t", table, "-X", chain])
                done.append(f"{tool} -t {table} chain {chain}: deleted" + _failure(proc))
        return done


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    return "" if proc.returncode == 0 else f" FAILED ({proc.stderr.strip()})"
