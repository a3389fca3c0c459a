"""The kind node's programs that the Kubernetes build cache does not hold, from the Go module proxy.

kubeadm v1.34.4 asks for ``registry.k8s.io/etcd:3.6.5-0`` and
``registry.k8s.io/coredns/coredns:v1.12.1`` (``kubeadm config images list``), and
the node wants ``crictl`` of its Kubernetes minor. Each is built statically
(cgo off, ``-trimpath``) into ``/var/cache/sluice/kind-v1.34.4/bin``:

* etcd and etcdctl from a scratch module requiring ``go.etcd.io/etcd/server/v3``
  and ``go.etcd.io/etcd/etcdctl/v3`` (their own go.mod files replace the other
  etcd modules with ``../`` paths, so ``go install module@version`` refuses them;
  as dependencies those replaces are ignored);
* coredns and crictl with ``go install module/path@version``.

A binary is rebuilt only when its recipe (versions, Go, flags) changes; builds
of several processes wait for each other on a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness.build import BuildFailed, find_go
from tests.harness.cache import K8S_VERSION

ETCD_VERSION = "v3.6.5"
ETCD_IMAGE = "registry.k8s.io/etcd:3.6.5-0"
COREDNS_VERSION = "v1.12.1"
COREDNS_IMAGE = f"registry.k8s.io/coredns/coredns:{COREDNS_VERSION}"
CRICTL_VERSION = "v1.34.0"

CACHE_ENV = "SLUICE_KIND_CACHE"
DEFAULT_CACHE = Path("/var/cache/sluice") / f"kind-{K8S_VERSION}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


@dataclass(frozen=True)
class GoProgram:
    name: str
    package: str  # what `go build`/`go install` is given
    version: str
    ldflags: str = "-s -w"
    scratch_requires: tuple[str, ...] = ()  # modules a scratch module requires (etcd)


PROGRAMS = {
    "etcd": GoProgram(
        "etcd",
        "go.etcd.io/etcd/server/v3",
        ETCD_VERSION,
        scratch_requires=("go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"),
    ),
    "etcdctl": GoProgram(
        "etcdctl",
        "go.etcd.io/etcd/etcdctl/v3",
        ETCD_VERSION,
        scratch_requires=("go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"),
    ),
    "coredns": GoProgram("coredns", "github.com/coredns/coredns", COREDNS_VERSION),
    "crictl": GoProgram(
        "crictl",
        "sigs.k8s.io/cri-tools/cmd/crictl",
        CRICTL_VERSION,
        ldflags=f"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version={CRICTL_VERSION}",
    ),
}


def log(message: str) -> None:
    print(f"[kind-build] {message}", file=sys.stderr, flush=True)


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0", GOWORK="off", GOTOOLCHAIN="local", GOFLAGS="-mod=mod -buildvcs=false"
    )
    return env


def _go(go: str, args: list[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [go, *args], cwd=cwd, env=env or go_env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildFailed(
            f"{what} failed (go {' '.join(args)} in {cwd}, exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    log(f"{what}: {time.monotonic() - started:.0f} s")


def fingerprint(go: str, program: GoProgram) -> str:
    go_version = subprocess.run(
        [go, "version"], capture_output=True, text=True, check=True, env=go_env()
    ).stdout.strip()
    recipe = {"program": program.__dict__, "go": go_version, "cgo": False, "trimpath": True}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def binary(name: str) -> Path:
    return cache_root() / "bin" / name


def _stamp(path: Path) -> Path:
    return path.with_name(f".{path.name}.stamp")


def is_current(path: Path, wanted: str) -> bool:
    stamp = _stamp(path)
    return path.is_file() and stamp.is_file() and stamp.read_text() == wanted


def stamp_of(name: str) -> str:
    """The recipe fingerprint a built program carries (inputs of the images made from it)."""
    return _stamp(binary(name)).read_text()


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / "build.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {root / 'build.lock'}; waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_in_scratch_module(go: str, programs: list[GoProgram], out_dir: Path) -> None:
    version = programs[0].version
    requires = sorted({m for p in programs for m in p.scratch_requires})
    with tempfile.TemporaryDirectory(prefix="scratch-", dir=cache_root()) as tmp:
        module = Path(tmp)
        (module / "go.mod").write_text(
            "module sluice.local/kind-etcd\n\ngo 1.24\n\n"
            + "".join(f"require {m} {version}\n" for m in requires)
        )
        imports = "".join(f'\t_ "{p.package}"\n' for p in programs)
        (module / "tools.go").write_text(
            f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n"
        )
        _go(go, ["mod", "tidy"], module, f"go mod tidy ({', '.join(requires)} {version})")
        for program in programs:
            _go(
                go,
                ["build", "-trimpath", "-ldflags", program.ldflags, "-o",
                 str(out_dir / program.name), program.package],
                module,
                f"go build {program.name} {program.version}",
            )  # fmt: skip


def _go_install(go: str, program: GoProgram, out_dir: Path) -> None:
    env = go_env()
    env["GOBIN"] = str(out_dir)
    with tempfile.TemporaryDirectory(prefix="install-", dir=cache_root()) as tmp:
        _go(
            go,
            ["install", "-trimpath", "-ldflags", program.ldflags,
             f"{program.package}@{program.version}"],
            Path(tmp),
            f"go install {program.name} {program.version}",
            env,
        )  # fmt: skip
    built = out_dir / Path(program.package).name
    if built.name != program.name:
        built.replace(out_dir / program.name)


def build() -> dict[str, Path]:
    """Build whatever is missing or stale; return name -> binary."""
    go = find_go()
    with _lock():
        wanted = {name: fingerprint(go, p) for name, p in PROGRAMS.items()}
        stale = [name for name in PROGRAMS if not is_current(binary(name), wanted[name])]
        if stale:
            out_dir = cache_root() / "bin" / ".building"
            shutil.rmtree(out_dir, ignore_errors=True)
            out_dir.mkdir(parents=True)
            scratch = [PROGRAMS[n] for n in stale if PROGRAMS[n].scratch_requires]
            if scratch:
                _build_in_scratch_module(go, scratch, out_dir)
            for name in stale:
                if not PROGRAMS[name].scratch_requires:
                    _go_install(go, PROGRAMS[name], out_dir)
            for name in stale:
                built = out_dir / name
                if not built.is_file():
                    raise BuildFailed(f"the build of {name} produced no {built}")
                built.replace(binary(name))
                _stamp(binary(name)).write_text(wanted[name])
            shutil.rmtree(out_dir, ignore_errors=True)
    return {name: binary(name) for name in PROGRAMS}
