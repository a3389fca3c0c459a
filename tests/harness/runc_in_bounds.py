#!/usr/bin/python3 -I
"""runc, asked only for the capabilities its caller may hold.

Some machines (this one among them) give root a capability bounding set without
``CAP_SYS_RESOURCE``. Docker 20.10 asks for every capability the kernel knows
for a ``--privileged`` container (and its ``docker exec`` processes), and runc
then fails with "unable to apply caps: operation not permitted". kind always
runs its nodes privileged, so the project's own Docker daemon uses this wrapper
as its default runtime on such machines (``tests/harness/dockerd.py``): it drops
from the container's (``create``/``run``) or process's (``exec``) spec the
capabilities outside this process's bounding set, and executes the real runc.
On a machine whose root holds every capability it is never installed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RUNC = os.environ.get("SLUICE_REAL_RUNC", "/usr/bin/runc")
# Index = capability number (linux/capability.h), up to CAP_CHECKPOINT_RESTORE.
CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
)
# runc's global options that take a value, so that a value is not taken for the command.
GLOBAL_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu"}


def bounding_set() -> set[str]:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return {f"CAP_{name}" for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}
    raise RuntimeError("no CapBnd line in /proc/self/status")


def option_value(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def command(argv: list[str]) -> tuple[str, list[str]] | None:
    """runc's command and the arguments after it."""
    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            continue
        if i and argv[i - 1] in GLOBAL_VALUE_OPTIONS:
            continue
        return arg, argv[i + 1 :]
    return None


def spec_file(argv: list[str]) -> tuple[Path, bool] | None:
    """The JSON file holding the capabilities runc will apply, and whether it is a process."""
    found = command(argv)
    if found is None:
        return None
    name, rest = found
    if name in ("create", "run"):
        bundle = option_value(rest, "--bundle", "-b") or os.getcwd()
        return Path(bundle) / "config.json", False
    if name == "exec":
        process = option_value(rest, "--process", "-p")
        return (Path(process), True) if process else None
    return None


def trim(capabilities: dict[str, list[str]], allowed: set[str]) -> bool:
    changed = False
    for kind, names in capabilities.items():
        kept = [n for n in names if n in allowed]
        if kept != names:
            capabilities[kind] = kept
            changed = True
    return changed


def main(argv: list[str]) -> None:
    target = spec_file(argv)
    if target is not None and target[0].is_file():
        path, is_process = target
        spec = json.loads(path.read_text())
        process = spec if is_process else spec.get("process", {})
        caps = process.get("capabilities")
        if caps and trim(caps, bounding_set()):
            path.write_text(json.dumps(spec))
    os.execv(RUNC, [RUNC, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
