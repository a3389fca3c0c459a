"""Running a CNI plugin the way a runtime does: CNI_* in the environment, the
network configuration on stdin, the result or error JSON on stdout.

sluice uses it to run a delegated IPAM plugin; the tests, the benchmarks and
the demo use it to run sluice and the reference plugins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

DEFAULT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class Invocation(NamedTuple):
    """One plugin execution: exit code, stdout parsed as JSON (None if it is not),
    raw output, and how long it took."""

    rc: int
    out: Any
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_code(self) -> int | None:
        return self.out.get("code") if isinstance(self.out, dict) else None

    def ok(self) -> Invocation:
        if self.rc != 0:
            raise AssertionError(f"plugin failed (exit {self.rc}): {self.stdout} {self.stderr}")
        return self


def cni_env(
    command: str,
    *,
    container_id: str = "",
    netns: str = "",
    ifname: str = "",
    cni_args: str = "",
    cni_path: str = "",
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a runtime sets for one call (on top of ``base``, or a bare PATH)."""
    env = dict(base) if base is not None else {"PATH": DEFAULT_PATH}
    env.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_ARGS=cni_args,
        CNI_PATH=cni_path,
    )
    return env


def invoke(
    binary: str,
    env: Mapping[str, str],
    stdin: bytes | dict[str, Any],
    timeout: float | None = None,
) -> Invocation:
    """Exec ``binary`` once; OSError if it cannot be started."""
    import subprocess  # only a delegated IPAM needs it: the plugin's own path does not

    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    started = time.perf_counter()
    proc = subprocess.run(
        [binary], input=data, env=dict(env), capture_output=True, timeout=timeout, check=False
    )
    seconds = time.perf_counter() - started
    stdout = proc.stdout.decode(errors="replace")
    try:
        out = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        out = None
    return Invocation(proc.returncode, out, stdout, proc.stderr.decode(errors="replace"), seconds)
