"""Drive a private containerd 1.6 as a CNI client: `ctr run --cni` and the CRI plugin.

Each ``PrivateContainerd`` owns a fresh temp dir holding its root, state, socket and
config, so it never touches (or collides with) a system containerd. A few paths are
fixed in containerd 1.6 and cannot be moved; they are handled explicitly:

* shim sockets always live in ``/run/containerd/s`` (removed by the shims on exit);
* ``ctr run --cni`` reads ``/etc/cni/net.d`` and searches ``/opt/cni/bin:/usr/lib/cni``
  (see ``CniNetwork.install_system``);
* libcni caches results in ``/var/lib/cni/results``.

Directories this module had to create in those places are removed again once empty.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

# Fixed locations used by `ctr run --cni` in containerd 1.6 (no flag or env overrides).
CTR_CNI_CONF_DIR = Path("/etc/cni/net.d")
CTR_CNI_BIN_DIR = Path("/opt/cni/bin")
# CNI_PATH that Debian's ctr 1.6 passes to plugins, measured: /opt/cni/bin first.
CTR_CNI_PATH = (CTR_CNI_BIN_DIR, Path("/usr/lib/cni"))
CNI_CONF_SUFFIXES = (".conf", ".conflist", ".json")
CNI_RESULTS_DIR = Path("/var/lib/cni/results")
CONTAINERD_RUN_DIR = Path("/run/containerd")

CRI_NAMESPACE = "k8s.io"
ADDRESS_RE = re.compile(r"inet (?P<ip>\d+\.\d+\.\d+\.\d+)/(?P<prefix>\d+)")


class CommandFailed(RuntimeError):
    """A helper command exited non-zero; the message carries its full output."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.proc = proc
        super().__init__(
            f"{' '.join(map(str, proc.args))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )


def run_cmd(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; raise ``CommandFailed`` if asked to check."""
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if check and proc.returncode != 0:
        raise CommandFailed(proc)
    return proc


def unique_id(prefix: str) -> str:
    """A name that is unique across runs and valid as container, pod and file name."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def find_crictl() -> str | None:
    """crictl from PATH, else the copy the Makefile installs under .tools/bin."""
    found = shutil.which("crictl")
    if found:
        return found
    local = REPO_ROOT / ".tools" / "bin" / "crictl"
    return str(local) if os.access(local, os.X_OK) else None


# --- host bookkeeping ----------------------------------------------------------------


class CreatedDirs:
    """Create directories and later remove exactly those that did not exist before.

    Removal only succeeds on empty directories, so anything another process put there
    in the meantime is left alone.
    """

    def __init__(self) -> None:
        self._created: list[Path] = []

    def note_missing(self, path: Path) -> None:
        """Remember ``path`` and its missing ancestors as ours, without creating them."""
        missing: list[Path] = []
        for candidate in (path, *path.parents):
            if candidate.exists():
                break
            missing.append(candidate)
        self._created.extend(p for p in reversed(missing) if p not in self._created)

    def makedirs(self, path: Path) -> Path:
        self.note_missing(path)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def remove_empty(self) -> None:
        # Deepest first, and sub-directories others' tools created inside ours too.
        for top in sorted(self._created, key=lambda p: len(p.parts), reverse=True):
            if top.is_dir() and not top.is_symlink():
                for dirpath, _dirs, _files in os.walk(top, topdown=False):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)
        self._created = [p for p in self._created if p.exists()]


def cni_cache_entries(tokens: Iterable[str]) -> list[Path]:
    """libcni result-cache files whose name mentions any of ``tokens`` (ids, net names)."""
    tokens = [t for t in tokens if t]
    if not CNI_RESULTS_DIR.is_dir():
        return []
    return sorted(p for p in CNI_RESULTS_DIR.iterdir() if any(t in p.name for t in tokens))


def remove_cni_cache_entries(tokens: Iterable[str]) -> None:
    for entry in cni_cache_entries(tokens):
        entry.unlink(missing_ok=True)


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below ``base``, deepest first (the order to unmount them)."""
    out = run_cmd(["findmnt", "-rn", "-o", "TARGET"], check=False).stdout
    # findmnt -r escapes unsafe characters as \xHH.
    targets = [re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m[1], 16)), t) for t in out.split()]
    prefix = str(base).rstrip("/") + "/"
    ours = {t for t in targets if t == str(base) or t.startswith(prefix)}
    return sorted(ours, key=len, reverse=True)


def unmount_all_under(base: Path) -> None:
    for target in mounts_under(base):
        if run_cmd(["umount", target], check=False).returncode != 0:
            run_cmd(["umount", "-R", "-l", target], check=False)


def cgroup_hierarchies() -> list[Path]:
    out = run_cmd(["findmnt", "-rn", "-t", "cgroup,cgroup2", "-o", "TARGET"], check=False)
    return [Path(t) for t in out.stdout.split()]


def remove_cgroup_tree(relative: str) -> None:
    """rmdir ``relative`` (e.g. "/sluice-test-x") in every cgroup hierarchy, leaves first."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / relative.lstrip("/")
        if top.is_dir():
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _children_of(pid: int) -> list[int]:
    children: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The comm field may contain spaces; ppid is the 2nd field after ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def _shims_for(address: Path) -> dict[int, list[str]]:
    """Running shims started by the containerd at ``address``: pid -> argv."""
    shims: dict[int, list[str]] = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if "containerd-shim" in argv[0] and str(address) in argv:
                shims[int(cmdline.parent.name)] = argv
    return shims


def _shim_socket(argv: list[str]) -> Path | None:
    """The socket a shim serves; containerd 1.6 derives it from address, namespace, id."""
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    try:
        key = os.path.join(opts["-address"], opts["-namespace"], opts["-id"])
    except KeyError:
        return None
    return CONTAINERD_RUN_DIR / "s" / hashlib.sha256(key.encode()).hexdigest()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def pick_unused_subnet(prefix: str = "10.249") -> ipaddress.IPv4Network:
    """A random /24 under ``prefix`` that overlaps no address or route on this host."""
    used: list[ipaddress.IPv4Network] = []
    routes = run_cmd(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout
    for route in json.loads(routes or "[]"):
        with contextlib.suppress(ValueError):
            if route.get("dst") not in (None, "default"):
                used.append(ipaddress.ip_network(route["dst"], strict=False))
    addrs = run_cmd(["ip", "-j", "-4", "addr"], check=False).stdout
    for link in json.loads(addrs or "[]"):
        for info in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    octets = list(range(256))
    random.shuffle(octets)
    for octet in octets:
        candidate = ipaddress.IPv4Network(f"{prefix}.{octet}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError(f"no free /24 under {prefix}.0.0/16")


def host_links_with_address_in(subnet: ipaddress.IPv4Network) -> list[str]:
    """Host interfaces that still carry an address from ``subnet`` (leaked veths)."""
    out = run_cmd(["ip", "-j", "-4", "addr"], check=False).stdout
    return [
        link["ifname"]
        for link in json.loads(out or "[]")
        if any(ipaddress.ip_address(a["local"]) in subnet for a in link.get("addr_info", []))
    ]


# --- the network under test ----------------------------------------------------------


class CniNetwork:
    """A CNI network configuration as containerd's two CNI clients consume it.

    * The CRI plugin is pointed at ``bin_dir`` / ``conf_dir`` through its config.
    * ``ctr run --cni`` only reads fixed system paths, so ``install_system`` puts the
      conflist into /etc/cni/net.d (under a name that sorts first, because ctr uses
      the first file) and links ``system_plugins`` into /opt/cni/bin, backing up any
      file it would shadow. ``uninstall_system`` restores the previous state exactly.

    Subclasses provide the conflist, the plugin binaries and the release checks.
    """

    #: binaries ctr must find in /opt/cni/bin (plugins not already in /usr/lib/cni)
    system_plugins: tuple[Path, ...] = ()

    def __init__(
        self,
        name: str,
        conflist: dict[str, Any],
        workdir: Path,
        subnet: ipaddress.IPv4Network,
    ) -> None:
        self.name = name
        self.subnet = subnet  # pods must get their address from here
        self.conflist = conflist
        self.workdir = workdir
        self.bin_dir = workdir / "bin"
        self.conf_dir = workdir / "net.d"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.conf_file_name = f"00-{name}.conflist"
        (self.conf_dir / self.conf_file_name).write_text(json.dumps(conflist, indent=2))
        self._dirs = CreatedDirs()
        # libcni creates its cache dir on first use; drop it again if it is new.
        self._cache_dirs = CreatedDirs()
        self._cache_dirs.note_missing(CNI_RESULTS_DIR)
        self._installed: list[Path] = []
        self._backups: dict[Path, Path] = {}

    # Hooks for subclasses -----------------------------------------------------------

    def assert_released(self) -> None:
        """Fail if the network still holds resources (addresses, links, state)."""
        raise NotImplementedError

    def assert_pod_args(self, namespace: str, name: str) -> None:
        """Fail unless the plugin saw K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS."""
        raise NotImplementedError

    # System install for ctr --------------------------------------------------------

    def link_plugins(self, sources: Iterable[Path]) -> None:
        """Symlink plugin binaries into ``bin_dir`` (the CRI plugin's CNI_PATH)."""
        for source in sources:
            (self.bin_dir / source.name).symlink_to(source)

    def install_system(self) -> None:
        self._dirs.makedirs(CTR_CNI_CONF_DIR)
        conf = CTR_CNI_CONF_DIR / self.conf_file_name
        if conf.exists():
            raise FileExistsError(conf)
        self._installed.append(conf)
        shutil.copyfile(self.conf_dir / self.conf_file_name, conf)
        # ctr loads only the alphabetically first network config file.
        configs = [p.name for p in CTR_CNI_CONF_DIR.iterdir() if p.suffix in CNI_CONF_SUFFIXES]
        if min(configs) != conf.name:
            raise RuntimeError(f"ctr would load {min(configs)}, not {conf.name}")
        if self.system_plugins:
            self._dirs.makedirs(CTR_CNI_BIN_DIR)
        for plugin in self.system_plugins:
            self._install_plugin(plugin)

    def _install_plugin(self, plugin: Path) -> None:
        target = CTR_CNI_BIN_DIR / plugin.name
        if target.exists() or target.is_symlink():
            backup = target.with_name(f".{target.name}.{unique_id('backup')}")
            target.rename(backup)
            self._backups[target] = backup
        self._installed.append(target)
        target.symlink_to(plugin)

    def uninstall_system(self) -> None:
        """Undo ``install_system``; safe to call repeatedly and after partial installs."""
        for path in reversed(self._installed):
            path.unlink(missing_ok=True)
        self._installed.clear()
        for target, backup in self._backups.items():
            backup.rename(target)
        self._backups.clear()
        self._dirs.remove_empty()

    def close(self) -> None:
        self.uninstall_system()
        remove_cni_cache_entries([self.name])
        self._cache_dirs.remove_empty()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- containerd ------------------------------------------------------------------------


class CtrRun:
    """A foreground ``ctr run --rm --cni`` running in the background.

    Foreground matters: only a foreground ctr calls CNI DEL (and removes the container)
    when the task exits; ``ctr run -d`` never does.
    """

    def __init__(self, argv: list[str], container_id: str, namespace: str) -> None:
        self.container_id = container_id
        self.namespace = namespace
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def cni_container_id(self) -> str:
        """The CNI_CONTAINERID ctr passes: ``<namespace>-<id>``."""
        return f"{self.namespace}-{self.container_id}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self._lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        """First output line matching ``pattern``; fail if ctr exits or time runs out."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if match := pattern.search(line):
                        return match
                seen = len(self._lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"ctr run {self.container_id}: no line matching {pattern.pattern!r} "
                        f"(exit={self.proc.poll()}); output:\n" + "\n".join(self._lines)
                    )
                self._cond.wait(min(remaining, 0.5))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code


class PrivateContainerd:
    """A throw-away containerd daemon with its own root, state, socket and CRI config.

    Use it as a context manager: leaving it stops ``ctr run`` clients, removes pods
    (through CRI, so the CNI plugin sees DEL), tasks, containers and snapshots, stops
    the daemon and its shims, unmounts and deletes everything it created.
    """

    def __init__(
        self,
        *,
        cni_bin_dir: Path,
        cni_conf_dir: Path,
        sandbox_image: str,
        start_timeout: float = 20.0,
        base: Path | None = None,
        netns: str | None = None,
    ) -> None:
        # A caller-chosen ``base`` (named ``sluice-ctrd-*``: its name is also the
        # cgroup parent) lets another process clean up after a crash with ``close``.
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="sluice-ctrd-"))
        elif not base.name.startswith("sluice-ctrd-"):
            raise ValueError(f"containerd base {base} must be named sluice-ctrd-*")
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.root = self.base / "root"
        self.state = self.base / "state"
        self.socket = self.base / "containerd.sock"
        self.config_path = self.base / "config.toml"
        self.log_path = self.base / "containerd.log"
        self.fifo_dir = self.state / "fifo"
        self.runc_root = self.state / "runc"
        self.scratch = self.base / "scratch"
        # All containers' cgroups go below this, so cleanup is one rmdir -r.
        self.cgroup_parent = "/" + self.base.name
        self.cni_bin_dir = cni_bin_dir
        self.cni_conf_dir = cni_conf_dir
        self.sandbox_image = sandbox_image
        self.start_timeout = start_timeout
        # A named network namespace (``ip netns``) to run the daemon in, as a node of a
        # multi-node cluster does: its CNI plugins then wire pods into that node.
        self.netns = netns
        self.snapshotter = "overlayfs"
        self._proc: subprocess.Popen[bytes] | None = None
        self._host_dirs = CreatedDirs()
        self._runs: list[CtrRun] = []
        self._ids: set[str] = set()

    # lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> PrivateContainerd:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            # pytest shows captured stderr for failing tests: the daemon's view helps.
            print(f"--- tail of {self.log_path} ---\n{self.log_tail()}", file=sys.stderr)
        self.close()

    def start(self) -> None:
        for d in (self.root, self.state, self.fifo_dir, self.runc_root, self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        # Shims create /run/containerd/s and libcni /var/lib/cni; remember what was new.
        self._host_dirs.note_missing(CONTAINERD_RUN_DIR / "s")
        self._host_dirs.note_missing(CNI_RESULTS_DIR)
        self.snapshotter = "overlayfs" if self._overlayfs_works() else "native"
        self.config_path.write_text(self.config_toml())
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [*self.argv_prefix, "containerd", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in pytest must not kill it before cleanup ran.
                start_new_session=True,
            )
        self._wait_until_serving()

    @property
    def argv_prefix(self) -> list[str]:
        """What runs the daemon in ``netns`` (nsenter execs, so the pid is containerd's)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []

    def config_toml(self) -> str:
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return f"""\
version = 2
root = "{self.root}"
state = "{self.state}"

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.base / "opt"}"

{cri}]
  sandbox_image = "{self.sandbox_image}"
  # CRI gives sandboxes oom_score_adj -998; lowering it needs CAP_SYS_RESOURCE,
  # which some VMs withhold even from root (runc then fails with "can't get final
  # child's PID from pipe"). Restricting clamps it to containerd's own score.
  restrict_oom_score_adj = true
  # Pod netns bind mounts go below our state dir instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
{cri}.containerd]
  snapshotter = "{self.snapshotter}"
  default_runtime_name = "runc"
{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{self.runc_root}"
{cri}.cni]
  bin_dir = "{self.cni_bin_dir}"
  conf_dir = "{self.cni_conf_dir}"
  max_conf_num = 1
"""

    def _overlayfs_works(self) -> bool:
        probe = self.base / "overlay-probe"
        dirs = {n: probe / n for n in ("lower", "upper", "work", "merged")}
        for d in dirs.values():
            d.mkdir(parents=True)
        opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mount = ["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"])]
        mounted = run_cmd(mount, check=False).returncode == 0
        if mounted:
            run_cmd(["umount", dirs["merged"]], check=False)
        shutil.rmtree(probe, ignore_errors=True)
        return mounted

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"containerd exited {self._proc.returncode}:\n{self.log_tail()}")
            if self.socket.exists() and self.ctr("version", check=False, timeout=5).returncode == 0:
                return
            time.sleep(0.05)
        raise TimeoutError(
            f"containerd not serving after {self.start_timeout}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def close(self) -> None:
        """Tear everything down; each step runs even if an earlier one failed."""
        steps = (
            self.stop_runs,
            self._remove_pods,
            self._remove_containers,
            self._stop_daemon,
            self._kill_stray_shims,
            lambda: unmount_all_under(self.base),
            lambda: shutil.rmtree(self.base, ignore_errors=True),
            lambda: remove_cgroup_tree(self.cgroup_parent),
            lambda: remove_cni_cache_entries(self._ids),
            self._host_dirs.remove_empty,
        )
        errors: list[BaseException] = []
        for step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise RuntimeError(f"containerd cleanup failed: {errors!r}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The daemon's pid while it runs (shims are separate processes)."""
        return self._proc.pid if self.running and self._proc is not None else None

    def stop_runs(self) -> None:
        """Stop every ``ctr run`` started here, letting ctr send its CNI DEL."""
        for run in self._runs:
            self.stop_run(run)

    def _remove_pods(self) -> None:
        # Through CRI, so the CNI plugin gets its DEL like under a kubelet.
        if not self.running or find_crictl() is None:
            return
        pods = self.crictl("pods", "-q", check=False, timeout=15).stdout.split()
        for pod in pods:
            self.remove_pod(pod, check=False)

    def _remove_containers(self) -> None:
        if not self.running:
            return
        namespaces = self.ctr("namespaces", "ls", "-q", check=False).stdout.split()
        for ns in namespaces:
            for task in self.ctr("tasks", "ls", "-q", namespace=ns, check=False).stdout.split():
                self.ctr("tasks", "rm", "-f", task, namespace=ns, check=False)
            for cid in self.ctr("containers", "ls", "-q", namespace=ns, check=False).stdout.split():
                self._ids.add(cid)
                self.ctr("containers", "rm", cid, namespace=ns, check=False)
            self._remove_active_snapshots(ns)

    def _remove_active_snapshots(self, namespace: str) -> None:
        """Active (rootfs) snapshots no container owns any more; image layers can stay."""
        snapshots = ("snapshots", "--snapshotter", self.snapshotter)
        out = self.ctr(*snapshots, "ls", namespace=namespace, check=False).stdout
        for line in out.splitlines()[1:]:  # KEY PARENT KIND, PARENT may be empty
            fields = line.split()
            if fields and fields[-1] == "Active":
                self.ctr(*snapshots, "rm", fields[0], namespace=namespace, check=False)

    def _stop_daemon(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def _kill_stray_shims(self) -> None:
        """Shims outlive containerd by design; kill those of this daemon and their tasks."""
        for shim, argv in _shims_for(self.socket).items():
            for child in _children_of(shim):
                _kill(child)
            _kill(shim)
            # A killed shim cannot remove its socket in the shared /run/containerd/s.
            if (sock := _shim_socket(argv)) is not None:
                sock.unlink(missing_ok=True)

    # ctr ----------------------------------------------------------------------------

    def ctr(
        self,
        *args: str | os.PathLike[str],
        namespace: str = "default",
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.socket), "--namespace", namespace, *args]
        return run_cmd(argv, check=check, timeout=timeout)

    def import_image(self, tar: Path, namespace: str = "default") -> str:
        """Import an OCI layout tar, unpacked for our snapshotter; return the image name."""
        out = self.ctr(
            "images", "import", "--snapshotter", self.snapshotter, tar, namespace=namespace
        ).stdout
        match = re.search(r"unpacking (\S+) \(sha256:", out)
        if not match:
            raise RuntimeError(f"cannot find the imported image name in: {out!r}")
        return match[1]

    def run_cni_container(
        self, image: str, container_id: str, cmd: Sequence[str], namespace: str = "default"
    ) -> CtrRun:
        """Start ``ctr run --rm --cni`` in the background (see ``CtrRun``)."""
        argv = [
            "ctr",
            "--address",
            str(self.socket),
            "--namespace",
            namespace,
            "run",
            "--rm",
            "--cni",
            "--snapshotter",
            self.snapshotter,
            "--fifo-dir",
            str(self.fifo_dir),
            "--runc-root",
            str(self.runc_root),
            "--cgroup",
            f"{self.cgroup_parent}/{container_id}",
            image,
            container_id,
            *cmd,
        ]
        self._ids.add(container_id)
        run = CtrRun(argv, container_id, namespace)
        self._runs.append(run)
        return run

    def exec_in(
        self, run: CtrRun, *cmd: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        return self.ctr(
            "tasks",
            "exec",
            "--exec-id",
            unique_id("exec"),
            "--fifo-dir",
            self.fifo_dir,
            run.container_id,
            *cmd,
            namespace=run.namespace,
            check=check,
            timeout=timeout,
        )

    def stop_run(self, run: CtrRun, timeout: float = 20.0) -> int | None:
        """SIGKILL the task (sleep as PID 1 ignores SIGTERM) and let ctr clean up.

        ctr then sends CNI DEL and removes the container itself. ctr is only killed
        when it does not finish in time, which leaves the DEL undone.
        """
        if run.proc.poll() is None and self.running:
            kill = ("tasks", "kill", "-s", "SIGKILL", run.container_id)
            self.ctr(*kill, namespace=run.namespace, check=False, timeout=15)
        try:
            return run.wait(timeout)
        except subprocess.TimeoutExpired:
            run.proc.kill()
            run.wait(10)
            return None

    def container_ids(self, namespace: str = "default") -> list[str]:
        return self.ctr("containers", "ls", "-q", namespace=namespace).stdout.split()

    # CRI ----------------------------------------------------------------------------

    def crictl(
        self, *args: str | os.PathLike[str], check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        crictl = find_crictl()
        if crictl is None:
            raise FileNotFoundError("crictl is neither on PATH nor in .tools/bin")
        endpoint = f"unix://{self.socket}"
        config = self.base / "crictl.yaml"
        if not config.exists():
            # An explicit (empty) config stops crictl from reading /etc/crictl.yaml.
            config.write_text("")
        argv = [
            crictl,
            "--config",
            str(config),
            "--runtime-endpoint",
            endpoint,
            "--image-endpoint",
            endpoint,
            "--timeout",
            f"{int(timeout)}s",
            *args,
        ]
        return run_cmd(argv, check=check, timeout=timeout + 5)

    def crictl_json(self, command: str, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        # crictl stops parsing flags at the first positional argument: -o goes first.
        return json.loads(self.crictl(command, "-o", "json", *args, timeout=timeout).stdout)

    def wait_cri_ready(self, image: str | None = None, timeout: float = 20.0) -> None:
        """Wait until CRI reports runtime and network ready and knows ``image``.

        NetworkReady turns true once the CNI config is loaded; the image appears in
        CRI's store only after it processed the import event.
        """
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.crictl("info", check=False, timeout=10)
            last = proc.stdout + proc.stderr
            if proc.returncode == 0:
                conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
                ready = {c["type"]: c["status"] for c in conditions}
                image_ok = image is None or (
                    self.crictl("inspecti", image, check=False, timeout=10).returncode == 0
                )
                if ready.get("RuntimeReady") and ready.get("NetworkReady") and image_ok:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"CRI not ready after {timeout}s: {last}\n{self.log_tail()}")

    def run_pod(self, pod_config: Path, timeout: float = 60.0) -> str:
        """``crictl runp``; returns the sandbox id (also CNI_CONTAINERID)."""
        pod_id = self.crictl("runp", pod_config, timeout=timeout).stdout.strip()
        self._ids.add(pod_id)
        return pod_id

    def remove_pod(self, pod_id: str, check: bool = True) -> None:
        """``crictl stopp`` (CNI DEL with netns) then ``crictl rmp`` (DEL again, no netns)."""
        self.crictl("stopp", pod_id, check=check)
        self.crictl("rmp", pod_id, check=check)


def write_pod_config(dest_dir: Path, *, name: str, namespace: str, cgroup_parent: str) -> Path:
    """Write a CRI PodSandboxConfig like the kubelet sends, for ``crictl runp``."""
    config = {
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "attempt": 0},
        "hostname": name,
        "labels": {"app": name},
        "linux": {
            "cgroup_parent": cgroup_parent,
            # network 0 = POD: the pod gets its own netns, which is what CNI wires up.
            "security_context": {"namespace_options": {"network": 0, "pid": 1, "ipc": 0}},
        },
    }
    path = dest_dir / f"{name}.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def pod_netns_path(inspect: dict[str, Any]) -> str:
    """The network namespace path of a sandbox, from ``crictl inspectp -o json``."""
    namespaces = inspect["info"]["runtimeSpec"]["linux"]["namespaces"]
    paths = [ns.get("path", "") for ns in namespaces if ns["type"] == "network"]
    if not paths or not paths[0]:
        raise AssertionError(f"sandbox has no network namespace path: {namespaces}")
    return paths[0]


def addresses_in_netns(netns: str, ifname: str = "eth0") -> list[str]:
    out = run_cmd(["nsenter", f"--net={netns}", "ip", "-4", "-o", "addr", "show", ifname]).stdout
    return [m["ip"] for m in ADDRESS_RE.finditer(out)]
