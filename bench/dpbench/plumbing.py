"""Running commands, and cleanup steps that never stop the others."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from dpbench import traffic


def run(cmd: list, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr}")
    return proc


def in_pod(netns: str, *args: object, timeout: float = 60) -> dict:
    """Run one of the traffic helpers in a pod; its JSON answer."""
    command = ["ip", "netns", "exec", netns, sys.executable, traffic.__file__, *args]
    proc = run(command, timeout=timeout)
    return json.loads(proc.stdout)


def quietly(what: str, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
    """A cleanup step: failures are reported, never stop the other steps."""
    try:
        fn(*args, **kwargs)
    except FileNotFoundError:
        pass
    except Exception as err:
        print(f"cleanup: failed to {what}: {err}", file=sys.stderr)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
