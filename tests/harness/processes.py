"""Long-running daemons: start them with a log file, record them, stop them reliably.

A ``ProcessRecord`` is what a state file keeps: pid, the kernel's start time of that
pid (so a recycled pid is never mistaken for ours) and the log path. Every daemon
runs in its own session, so it survives a Ctrl-C of the harness and is stopped
explicitly, also by a later ``down`` from another process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_time: int
    argv: list[str]
    log: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(**data)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields follow the last ")".
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat, 0-based after comm


def is_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs (same pid and start time, not a zombie)."""
    fields = _stat_fields(record.pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == record.start_time


class Daemons:
    """The daemons started by this process, plus any adopted from a state file."""

    def __init__(self) -> None:
        self._popen: dict[int, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
    ) -> ProcessRecord:
        argv = [str(a) for a in argv]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._popen[proc.pid] = proc
        start_time = process_start_time(proc.pid)
        if start_time is None:
            raise RuntimeError(f"{name} ({argv[0]}) exited at once; see {log_path}")
        return ProcessRecord(name, proc.pid, start_time, argv, str(log_path))

    def exited(self, record: ProcessRecord) -> int | None:
        """Exit code if the daemon has exited (None while it runs)."""
        proc = self._popen.get(record.pid)
        if proc is not None:
            return proc.poll()
        return None if is_alive(record) else -1

    def stop(self, record: ProcessRecord, timeout: float = 15.0) -> None:
        """SIGTERM the daemon's process group, SIGKILL it after ``timeout``; reap it."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            if not self._signal(record, sig):
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self._running(record):
                time.sleep(0.05)
            if not self._running(record):
                break
        self._popen.pop(record.pid, None)
        if is_alive(record):
            raise RuntimeError(f"{record.name} (pid {record.pid}) survived SIGKILL")

    def _running(self, record: ProcessRecord) -> bool:
        proc = self._popen.get(record.pid)
        if proc is not None:
            return proc.poll() is None
        return is_alive(record)

    def _signal(self, record: ProcessRecord, sig: signal.Signals) -> bool:
        if not self._running(record):
            return False
        with contextlib.suppress(ProcessLookupError):
            # Each daemon leads its own session, so its group holds its helpers too.
            if os.getpgid(record.pid) == record.pid:
                os.killpg(record.pid, sig)
            else:
                os.kill(record.pid, sig)
        return True


def log_tail(path: str | Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def assert_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise RuntimeError(
                f"port {host}:{port} for {what} is in use ({exc.strerror}); is another "
                "cluster up? (`python -m tests.harness down`, or set SLUICE_K8S_PORT_BASE)"
            ) from None


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    details: Callable[[], str] = lambda: "",
    interval: float = 0.25,
) -> None:
    """Poll ``condition`` until it holds; on timeout raise with ``details()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s\n{details()}")
