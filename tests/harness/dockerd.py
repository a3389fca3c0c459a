"""A Docker daemon for the image builds and kind, through the docker SDK.

``ensure()`` uses the daemon that ``DOCKER_HOST`` names, else the machine's own
(``/var/run/docker.sock``), else the project's own (``/run/sluice-docker``) when
a previous run left it up, and otherwise starts that one: Debian's ``dockerd``
with its own data root (``/var/cache/sluice/docker``, so that images and the
layer cache survive), exec root, socket and pid file, so it never meets a
system daemon's state. It runs without iptables rules (``"iptables": false``:
containers on one network still reach each other, published ports go through
docker-proxy and the embedded DNS lives in each container's own namespace) and
without ``docker0`` (``"bridge": "none"``); image builds use the host's network.
Before it starts, ``docker_host.HostSnapshot`` records what it could change on
the host; ``stop()`` removes the networks, stops the daemon only when this
module started it, and puts the host back (``docker_host`` lists what that is).

On a machine whose root lacks capabilities (``CAP_SYS_RESOURCE`` here), the
daemon's default runtime is ``runc_in_bounds.py``, since Docker 20.10 asks for
every capability for a privileged container (kind's nodes are privileged).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from tests.harness.docker_host import HostSnapshot

SYSTEM_SOCKET = Path("/var/run/docker.sock")
DATA_ROOT = Path(os.environ.get("SLUICE_DOCKER_ROOT") or "/var/cache/sluice/docker")
RUN_DIR = Path(os.environ.get("SLUICE_DOCKER_RUN") or "/run/sluice-docker")
SOCKET = RUN_DIR / "docker.sock"
PID_FILE = RUN_DIR / "dockerd.pid"
STATE_FILE = RUN_DIR / "started.json"
LOCK_FILE = RUN_DIR.parent / "sluice-docker.lock"
LOG_FILE = RUN_DIR / "dockerd.log"
WRAPPER = Path(__file__).resolve().with_name("runc_in_bounds.py")
# Labels of containers whose presence keeps the project's daemon running at stop().
KIND_CLUSTER_LABEL = "io.x-k8s.kind.cluster"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


class DockerUnavailable(RuntimeError):
    pass


@dataclass
class Daemon:
    """A reachable Docker daemon; ``own`` when it is the project's own."""

    base_url: str
    own: bool
    started_now: bool = False

    def client(self, timeout: float = 600.0) -> docker.DockerClient:
        # version="auto" negotiates the API: Debian's dockerd 20.10 speaks 1.41.
        return docker.DockerClient(base_url=self.base_url, version="auto", timeout=timeout)

    @property
    def docker_host(self) -> str:
        return self.base_url


def log(message: str) -> None:
    print(f"[dockerd] {message}", flush=True)


def _answers(base_url: str) -> bool:
    try:
        client = docker.DockerClient(base_url=base_url, version="auto", timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (docker.errors.DockerException, OSError):
        return False


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def running() -> Daemon | None:
    """The daemon ``ensure()`` would use, if one answers now."""
    if os.environ.get("DOCKER_HOST"):
        url = os.environ["DOCKER_HOST"]
        if not _answers(url):
            raise DockerUnavailable(f"DOCKER_HOST={url} does not answer")
        return Daemon(url, own=url == f"unix://{SOCKET}")
    if SYSTEM_SOCKET.exists() and _answers(f"unix://{SYSTEM_SOCKET}"):
        return Daemon(f"unix://{SYSTEM_SOCKET}", own=False)
    if SOCKET.exists() and _answers(f"unix://{SOCKET}"):
        return Daemon(f"unix://{SOCKET}", own=True)
    return None


def ensure() -> Daemon:
    """A daemon to talk to; starts the project's own when none answers."""
    with _locked():
        found = running()
        if found is not None:
            return found
        return _start()


def missing_capabilities() -> list[str]:
    """Capabilities the kernel knows that this process's bounding set lacks."""
    from tests.harness import runc_in_bounds

    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    known = {f"CAP_{name}" for name in runc_in_bounds.CAPABILITIES[: last + 1]}
    return sorted(known - runc_in_bounds.bounding_set())


def daemon_config() -> dict[str, object]:
    config: dict[str, object] = {
        "iptables": False,
        "ip-masq": False,
        "bridge": "none",
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "2"},
        "features": {"buildkit": False},
    }
    if missing_capabilities():
        wrapper = RUN_DIR / "bin" / "runc-in-bounds"
        config["runtimes"] = {"runc-in-bounds": {"path": str(wrapper)}}
        config["default-runtime"] = "runc-in-bounds"
    return config


def _start() -> Daemon:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailable(
            "no Docker daemon answers and there is no dockerd to start: "
            "install Debian's docker.io (make kind-deps)"
        )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    config = daemon_config()
    if "runtimes" in config:
        (RUN_DIR / "bin").mkdir(exist_ok=True)
        shutil.copy2(WRAPPER, RUN_DIR / "bin" / "runc-in-bounds")
        (RUN_DIR / "bin" / "runc-in-bounds").chmod(0o755)
        log(f"root lacks {', '.join(missing_capabilities())}: runtime runc-in-bounds")
    config_file = RUN_DIR / "daemon.json"
    config_file.write_text(json.dumps(config, indent=1) + "\n")
    snapshot = HostSnapshot.capture()
    argv = [
        dockerd,
        "--config-file", str(config_file),
        "--data-root", str(DATA_ROOT),
        "--exec-root", str(RUN_DIR / "exec"),
        "--pidfile", str(PID_FILE),
        "--host", f"unix://{SOCKET}",
    ]  # fmt: skip
    started = time.monotonic()
    with LOG_FILE.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    STATE_FILE.write_text(
        json.dumps({"pid": proc.pid, "argv": argv, "host": snapshot.to_json()}, indent=1)
    )
    url = f"unix://{SOCKET}"
    deadline = started + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DockerUnavailable(
                f"dockerd exited {proc.returncode} while starting; see {LOG_FILE}:\n"
                + _tail(LOG_FILE)
            )
        if SOCKET.exists() and _answers(url):
            log(f"started dockerd (pid {proc.pid}, data root {DATA_ROOT}) "
                f"in {time.monotonic() - started:.1f} s: DOCKER_HOST={url}")  # fmt: skip
            return Daemon(url, own=True, started_now=True)
        time.sleep(0.3)
    _terminate(proc.pid)
    raise DockerUnavailable(f"dockerd did not answer on {SOCKET} in {START_TIMEOUT:.0f} s")


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child not yet reaped) counts as gone.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop(*, force: bool = False) -> list[str]:
    """Stop the project's own daemon and put the host back; return what was done.

    Leaves a daemon that this module did not start alone, and leaves its own
    running while a kind cluster's nodes exist (unless ``force``).
    """
    with _locked():
        if not STATE_FILE.exists():
            return []
        state = json.loads(STATE_FILE.read_text())
        done: list[str] = []
        url = f"unix://{SOCKET}"
        if _answers(url):
            client = docker.DockerClient(base_url=url, version="auto", timeout=120)
            try:
                nodes = client.containers.list(all=True, filters={"label": KIND_CLUSTER_LABEL})
                if nodes and not force:
                    names = ", ".join(c.name for c in nodes)
                    return [f"kept dockerd running: kind nodes {names} exist"]
                for container in client.containers.list(all=True):
                    container.remove(force=True)
                    done.append(f"removed container {container.name}")
                pruned = client.networks.prune().get("NetworksDeleted") or []
                done += [f"removed network {n}" for n in pruned]
            finally:
                client.close()
        pid = state["pid"]
        if PID_FILE.exists():
            with contextlib.suppress(ValueError):
                pid = int(PID_FILE.read_text().strip())
        if _alive(pid):
            _terminate(pid)
            done.append(f"stopped dockerd (pid {pid})")
        done += _unmount_leftovers()
        done += HostSnapshot.from_json(state["host"]).restore()
        STATE_FILE.unlink(missing_ok=True)
        SOCKET.unlink(missing_ok=True)
        # Its log and configuration stay for a look afterwards; its runtime state goes.
        for directory in (RUN_DIR / "exec", RUN_DIR / "bin"):
            shutil.rmtree(directory, ignore_errors=True)
        return done


def _unmount_leftovers() -> list[str]:
    """Mounts a killed daemon left under its exec root or data root (netns, overlays)."""
    out = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    ).stdout.split()
    done = []
    for target in sorted(out, key=len, reverse=True):
        if target.startswith((f"{RUN_DIR}/", f"{DATA_ROOT}/")):
            proc = subprocess.run(["umount", "-l", target], capture_output=True, check=False)
            done.append(f"unmounted {target}" + ("" if proc.returncode == 0 else " FAILED"))
    return done
