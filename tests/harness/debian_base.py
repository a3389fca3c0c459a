"""The Debian 12 base image, made here: no registry is reachable to pull ``debian:bookworm``.

``debootstrap --variant=minbase bookworm`` from Debian's mirror (a package
registry) into a directory, a few container conventions on top (apt sources
with the security and updates suites, no service starts in builds, no
documentation), a tar of it in the cache, and ``docker import`` of that tar as
``localhost/sluice-base/debian:bookworm``. The sluice image and the kind node
image both start from it (``ARG BASE``). The tar is kept, so another Docker
daemon imports it again without debootstrap; it is made again only when its
recipe (suite, variant, mirror, debootstrap's version, the files added)
changes.
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
from pathlib import Path

import docker
import docker.errors

SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = os.environ.get("SLUICE_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
SECURITY_MIRROR = (
    os.environ.get("SLUICE_DEBIAN_SECURITY_MIRROR") or "http://deb.debian.org/debian-security"
)
IMAGE = f"localhost/sluice-base/debian:{SUITE}"
CACHE_DIR = Path(os.environ.get("SLUICE_IMAGE_CACHE") or "/var/cache/sluice/images")
FINGERPRINT_LABEL = "dev.sluice.recipe"

# Files written into the root filesystem, as the usual container images of Debian have them.
EXTRA_FILES = {
    "etc/apt/sources.list": (
        f"deb {MIRROR} {SUITE} main\n"
        f"deb {MIRROR} {SUITE}-updates main\n"
        f"deb {SECURITY_MIRROR} {SUITE}-security main\n"
    ),
    # Package installs during image builds must not try to start services.
    "usr/sbin/policy-rc.d": "#!/bin/sh\nexit 101\n",
    "etc/apt/apt.conf.d/90sluice-container": (
        'APT::Install-Recommends "false";\n'
        'APT::Install-Suggests "false";\n'
        'Acquire::Languages "none";\n'
    ),
    "etc/dpkg/dpkg.cfg.d/90sluice-container": (
        "path-exclude /usr/share/doc/*\n"
        "path-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\n"
        "path-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/locale/*\n"
        "path-include /usr/share/locale/locale.alias\n"
    ),
}
EXECUTABLES = {"usr/sbin/policy-rc.d"}
# debootstrap leaves the host's name service files and its package lists behind.
REMOVED = ("etc/resolv.conf", "etc/hostname", "var/lib/apt/lists", "var/cache/apt/archives")


def log(message: str) -> None:
    print(f"[debian-base] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One builder at a time per cached artefact, across processes."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / f"{name}.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {CACHE_DIR / name}.lock; waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def debootstrap_version() -> str:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "debootstrap"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap is not installed (Debian package debootstrap)")
    return proc.stdout.strip()


def fingerprint() -> str:
    recipe = {
        "suite": SUITE,
        "variant": VARIANT,
        "mirror": MIRROR,
        "debootstrap": debootstrap_version(),
        "files": EXTRA_FILES,
        "removed": REMOVED,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_tar() -> Path:
    """The base root filesystem as a tar in the cache, made if missing."""
    wanted = fingerprint()
    tar = CACHE_DIR / f"debian-{SUITE}-{VARIANT}-{wanted}.tar"
    with cache_lock("debian-base"):
        if tar.is_file():
            return tar
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=CACHE_DIR))
        try:
            root = work / "rootfs"
            log(f"debootstrap --variant={VARIANT} {SUITE} from {MIRROR}")
            proc = subprocess.run(
                ["debootstrap", f"--variant={VARIANT}", SUITE, str(root), MIRROR],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(
                    f"debootstrap {SUITE} into {root} failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                )
            for name in REMOVED:
                target = root / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                    target.mkdir()
                else:
                    target.unlink(missing_ok=True)
            for name, text in EXTRA_FILES.items():
                path = root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                path.chmod(0o755 if name in EXECUTABLES else 0o644)
            partial = tar.with_suffix(".part")
            subprocess.run(
                ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."],
                check=True,
            )
            partial.replace(tar)
            for stale in CACHE_DIR.glob(f"debian-{SUITE}-{VARIANT}-*.tar"):
                if stale != tar:
                    stale.unlink()
            seconds = time.monotonic() - started
            log(f"{tar.name}: {tar.stat().st_size / 1e6:.0f} MB in {seconds:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tar


def image_recipe(client: docker.DockerClient, name: str) -> str | None:
    """The recipe label of a local image, or None when there is no such image."""
    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    return (image.labels or {}).get(FINGERPRINT_LABEL)


def ensure_image(client: docker.DockerClient) -> str:
    """``localhost/sluice-base/debian:bookworm`` in this daemon, current; returns its name."""
    wanted = fingerprint()
    if image_recipe(client, IMAGE) == wanted:
        return IMAGE
    tar = rootfs_tar()
    repository, tag = IMAGE.rsplit(":", 1)
    started = time.monotonic()
    changes = [
        f"LABEL {FINGERPRINT_LABEL}={wanted}",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        'CMD ["/bin/bash"]',
    ]
    client.api.import_image_from_file(str(tar), repository=repository, tag=tag, changes=changes)
    if image_recipe(client, IMAGE) != wanted:
        raise RuntimeError(f"docker import of {tar} did not produce {IMAGE}")
    log(f"imported {IMAGE} in {time.monotonic() - started:.0f} s")
    return IMAGE
