"""Build Kubernetes from the Go module proxy into the cache.

A scratch Go module requires ``k8s.io/kubernetes`` at ``K8S_VERSION`` and replaces
every staging module (which Kubernetes' own go.mod lists at v0.0.0 and points at its
``staging/`` tree) with its published ``STAGING_VERSION``. A ``tools.go`` behind the
``tools`` build tag imports every command, so one ``go mod tidy`` records all of
them. Then a single ``go build`` produces the commands (cgo off, so they share one
set of compiled packages with agnhost, which must be static) and ``go test -c`` the
e2e binary. Binaries that already carry a current stamp are not rebuilt; concurrent
builds wait for each other on a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.harness import images
from tests.harness.cache import (
    COMMANDS,
    K8S_VERSION,
    STAGING_VERSION,
    TEST_BINARIES,
    K8sCache,
)

SCRATCH_MODULE = "sluice.local/k8s-build"
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
# `k8s.io/api => ./staging/src/k8s.io/api` in Kubernetes' go.mod.
STAGING_REPLACE_RE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/\1\s*$", re.M)
GO_DIRECTIVE_RE = re.compile(r"^go\s+(\S+)\s*$", re.M)
GODEBUG_RE = re.compile(r"^godebug\s+.*$", re.M)


class BuildFailed(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[k8s-build] {message}", file=sys.stderr, flush=True)


def find_go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if go is None:
        raise BuildFailed(
            "no `go` on PATH or in /usr/local/go/bin: Go is needed to build Kubernetes"
        )
    return go


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        GOWORK="off",
        # Never fetch another toolchain; the installed Go builds Kubernetes' go line.
        GOTOOLCHAIN="local",
        # -mod=mod lets `go test -c` add go.sum lines for test-only imports of
        # k8s.io/kubernetes/test/e2e, which tidy does not see in a dependency.
        GOFLAGS="-mod=mod -buildvcs=false",
    )
    return env


def ldflags() -> str:
    major, minor = K8S_VERSION.removeprefix("v").split(".")[:2]
    values = {
        "gitVersion": K8S_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = [f"-X {pkg}.{key}={val}" for pkg in VERSION_PACKAGES for key, val in values.items()]
    return " ".join(["-s", "-w", *flags])


def go_run(go: str, args: Sequence[str], cwd: Path, what: str) -> str:
    started = time.monotonic()
    proc = subprocess.run(
        [go, *args], cwd=cwd, env=go_env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildFailed(
            f"{what} failed (go {' '.join(args)} in {cwd}, exit {proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    log(f"{what}: {time.monotonic() - started:.0f} s")
    return proc.stdout


@contextlib.contextmanager
def build_lock(cache: K8sCache) -> Iterator[None]:
    cache.root.mkdir(parents=True, exist_ok=True)
    with cache.lock_file.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {cache.lock_file}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def recipe_fingerprint(go: str) -> str:
    """Changes whenever a rebuild would produce different binaries."""
    go_version = subprocess.run(
        [go, "version"], capture_output=True, text=True, check=True, env=go_env()
    ).stdout.strip()
    recipe = json.dumps(
        {
            "kubernetes": K8S_VERSION,
            "staging": STAGING_VERSION,
            "go": go_version,
            "ldflags": ldflags(),
            "flags": ["-trimpath"],
            "cgo": False,
        },
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()


# --- the scratch module -----------------------------------------------------------------


def kubernetes_go_mod(go: str, workdir: Path) -> str:
    """Kubernetes' own go.mod, downloaded from the module proxy."""
    out = go_run(
        go,
        ["mod", "download", "-json", f"k8s.io/kubernetes@{K8S_VERSION}"],
        workdir,
        f"download k8s.io/kubernetes@{K8S_VERSION}",
    )
    info = json.loads(out)
    if info.get("Error"):
        raise BuildFailed(f"cannot download k8s.io/kubernetes@{K8S_VERSION}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


def scratch_go_mod(upstream: str) -> str:
    staging = sorted(STAGING_REPLACE_RE.findall(upstream))
    if not staging:
        raise BuildFailed(f"no staging replace lines in k8s.io/kubernetes@{K8S_VERSION}'s go.mod")
    go_line = GO_DIRECTIVE_RE.search(upstream)
    lines = [
        f"module {SCRATCH_MODULE}",
        "",
        f"go {go_line[1] if go_line else '1.24.0'}",
        "",
        # Upstream's GODEBUG defaults, so the binaries behave like released ones.
        *GODEBUG_RE.findall(upstream),
        "",
        f"require k8s.io/kubernetes {K8S_VERSION}",
        "",
        "replace (",
        *(f"\t{module} => {module} {STAGING_VERSION}" for module in staging),
        ")",
        "",
    ]
    return "\n".join(lines)


def tools_go() -> str:
    imports = "\n".join(
        f'\t_ "{pkg}"' for pkg in sorted({*COMMANDS.values(), *TEST_BINARIES.values()})
    )
    return f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"


def prepare_module(go: str, cache: K8sCache, fingerprint: str) -> None:
    """Write go.mod and tools.go and run `go mod tidy`, unless done for this recipe."""
    module = cache.module_dir
    tidy_stamp = module / "tidy.stamp"
    # tools.go is part of the key: a command added to the recipe needs a new tidy.
    tidied = hashlib.sha256((fingerprint + tools_go()).encode()).hexdigest()
    if (module / "go.sum").is_file() and tidy_stamp.is_file() and tidy_stamp.read_text() == tidied:
        return
    shutil.rmtree(module, ignore_errors=True)
    module.mkdir(parents=True)
    upstream = kubernetes_go_mod(go, module)
    (module / "go.mod").write_text(scratch_go_mod(upstream))
    (module / "tools.go").write_text(tools_go())
    go_run(go, ["mod", "tidy"], module, "go mod tidy")
    tidy_stamp.write_text(tidied)


# --- binaries -------------------------------------------------------------------------


def build_commands(go: str, cache: K8sCache, names: Sequence[str], fingerprint: str) -> None:
    """One `go build` for all commands: packages compile once, links run in parallel."""
    out_dir = cache.bin_dir / ".building"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    args = ["build", "-trimpath", "-ldflags", ldflags(), "-o", f"{out_dir}/"]
    go_run(
        go, [*args, *(COMMANDS[n] for n in names)], cache.module_dir, f"go build {' '.join(names)}"
    )
    for name in names:
        built = out_dir / Path(COMMANDS[name]).name
        if not built.is_file():
            raise BuildFailed(f"go build did not produce {built} for {name}")
        built.replace(cache.binary(name))
        cache.mark_built(cache.binary(name), fingerprint)
    shutil.rmtree(out_dir, ignore_errors=True)


def build_test_binary(go: str, cache: K8sCache, name: str, fingerprint: str) -> None:
    target = cache.binary(name)
    partial = target.with_name(target.name + ".part")
    args = ["test", "-c", "-trimpath", "-ldflags", ldflags(), "-o", str(partial)]
    go_run(go, [*args, TEST_BINARIES[name]], cache.module_dir, f"go test -c {name}")
    partial.replace(target)
    cache.mark_built(target, fingerprint)


def build(cache: K8sCache | None = None) -> K8sCache:
    """Build whatever is missing or stale; return the cache. Safe to call concurrently."""
    cache = cache or K8sCache.default()
    with build_lock(cache):
        started = time.monotonic()
        timings: dict[str, float] = {}
        go = find_go()
        fingerprint = recipe_fingerprint(go)
        stale_commands = [n for n in COMMANDS if not cache.is_current(cache.binary(n), fingerprint)]
        stale_tests = [
            n for n in TEST_BINARIES if not cache.is_current(cache.binary(n), fingerprint)
        ]
        if stale_commands or stale_tests:
            stale = " ".join(stale_commands + stale_tests)
            log(f"building Kubernetes {K8S_VERSION} into {cache.root}: {stale}")
            cache.bin_dir.mkdir(parents=True, exist_ok=True)
            step = time.monotonic()
            prepare_module(go, cache, fingerprint)
            timings["module"] = time.monotonic() - step
            if stale_commands:
                step = time.monotonic()
                build_commands(go, cache, stale_commands, fingerprint)
                timings["commands"] = time.monotonic() - step
            for name in stale_tests:
                step = time.monotonic()
                build_test_binary(go, cache, name, fingerprint)
                timings[name] = time.monotonic() - step
        step = time.monotonic()
        if images.build_images(cache):
            timings["images"] = time.monotonic() - step
        if timings:
            timings["total"] = time.monotonic() - started
            record_timings(cache, timings)
            log("done in " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
        else:
            log(f"{cache.root} is up to date")
    return cache


def record_timings(cache: K8sCache, timings: dict[str, float]) -> None:
    entry = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        **{k: round(v, 1) for k, v in timings.items()},
    }
    history = []
    with contextlib.suppress(OSError, ValueError):
        history = json.loads(cache.timings_file.read_text())
    cache.timings_file.write_text(json.dumps([*history, entry], indent=1) + "\n")
