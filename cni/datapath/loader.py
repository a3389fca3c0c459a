"""Compiling the datapath with bcc and pinning it: once per node.

The programs in bpf/ are compiled by whoever needs them first (``sluicectl
datapath load``, the agent, or in "policy": "off" mode the first ADD that
finds nothing pinned), under a lock so that concurrent callers compile once.
Maps are pinned by the programs themselves (bcc reuses a pinned map), so a
reload with changed source keeps endpoints, policies and conntrack; the new
programs are pinned over the old ones and every attached veth is switched
to them, one atomic filter replacement each.

bcc only rewrites map calls in the main source file, so the loader inlines
the project's own headers (``#include "x.h"``) into one text first.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cni.datapath import bpf
from cni.datapath.maps import DEFAULT_CONFIG, PROGRAMS, Datapath
from cni.errors import ERR_KERNEL, CNIError

log = logging.getLogger("sluice")

SOURCE_DIR = Path(__file__).resolve().parent.parent.parent / "bpf"
BPFFS_ROOT = "/sys/fs/bpf"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
CFLAGS = ["-Wno-unused-function", "-Wno-macro-redefined"]


def inline_includes(path: Path, seen: set[Path] | None = None) -> str:
    """The source with its quoted includes expanded in place (each file once)."""
    seen = set() if seen is None else seen
    out: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        match = INCLUDE.match(line)
        if not match:
            out.append(line)
            continue
        header = path.parent / match.group(1)
        if header not in seen:
            seen.add(header)
            out.append(f'#line 1 "{header.name}"\n')
            out.append(inline_includes(header, seen))
            out.append(f'#line {number + 1} "{path.name}"\n')
    return "".join(out)


def program_source() -> str:
    """Both entry files in one compilation unit (one compile, shared helpers)."""
    seen: set[Path] = set()
    return "".join(inline_includes(SOURCE_DIR / f"{name}.c", seen) for name in PROGRAMS)


def source_hash(bpf_dir: str) -> str:
    digest = hashlib.sha256(program_source().encode())
    digest.update(bpf_dir.encode())
    return digest.hexdigest()[:16]


def ensure_bpffs() -> None:
    """bcc pins under /sys/fs/bpf; mount bpffs there if the node has not."""
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1:3] == [BPFFS_ROOT, "bpf"] for line in mounts):
            return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", BPFFS_ROOT.encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise CNIError(ERR_KERNEL, f'failed to mount bpffs at "{BPFFS_ROOT}": {os.strerror(err)}')


@contextmanager
def load_lock(bpf_dir: str) -> Iterator[None]:
    """Serialise loaders of one datapath: a lock on its bpffs directory."""
    ensure_bpffs()
    os.makedirs(bpf_dir, exist_ok=True)
    fd = os.open(bpf_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _marker(bpf_dir: str, digest: str) -> str:
    return os.path.join(bpf_dir, f"source_{digest}")


def is_current(bpf_dir: str) -> bool:
    """Pinned, and from the source this sluice has (a marker pinned beside it says)."""
    with Datapath(bpf_dir) as datapath:
        loaded = datapath.is_loaded()
    return loaded and os.path.exists(_marker(bpf_dir, source_hash(bpf_dir)))


def ensure_loaded(bpf_dir: str) -> bool:
    """Load the datapath unless it is pinned already; True if this call compiled it."""
    with Datapath(bpf_dir) as datapath:
        if datapath.is_loaded():
            return False
    with load_lock(bpf_dir):
        with Datapath(bpf_dir) as datapath:
            if datapath.is_loaded():  # another process compiled it meanwhile
                return False
        _load(bpf_dir)
    return True


def load(bpf_dir: str, force: bool = False) -> bool:
    """Compile and pin unless the pinned programs come from this source; True if loaded."""
    with load_lock(bpf_dir):
        if is_current(bpf_dir) and not force:
            return False
        _load(bpf_dir)
    return True


def _load(bpf_dir: str) -> None:
    started = time.monotonic()
    try:
        from bcc import BPF
    except ImportError as err:
        raise CNIError(
            ERR_KERNEL,
            f"failed to load the datapath: bcc is not available ({err}); install python3-bpfcc",
        ) from None
    try:
        module = BPF(text=program_source().encode(), cflags=[*CFLAGS, f'-DSL_PIN_DIR="{bpf_dir}"'])
        functions = {name: module.load_func(name.encode(), BPF.SCHED_CLS) for name in PROGRAMS}
    except Exception as err:
        raise CNIError(
            ERR_KERNEL, f'failed to compile the datapath into "{bpf_dir}": {err}'
        ) from None
    for name, function in functions.items():
        # Pin beside, then rename over the old pin: never a moment without one.
        staging = os.path.join(bpf_dir, f"{name}_new")  # bpffs refuses names with a dot
        if os.path.exists(staging):
            os.unlink(staging)
        bpf.obj_pin(function.fd, staging)
        os.replace(staging, os.path.join(bpf_dir, name))
    with Datapath(bpf_dir) as datapath:
        if datapath.config().ct_udp == 0:  # a new datapath: set the tunables
            datapath.set_config(
                **{name: getattr(DEFAULT_CONFIG, name) for name, _ in DEFAULT_CONFIG._fields_}
            )
        endpoints = list(datapath.endpoints())
    if endpoints:
        from cni.datapath.endpoint import switch_programs

        switch_programs(bpf_dir, endpoints)
    _pin_marker(bpf_dir)
    log.info(
        "datapath compiled and pinned in %s (%.1f s, %d endpoints switched)",
        bpf_dir,
        time.monotonic() - started,
        len(endpoints),
    )
    module.cleanup()


def _pin_marker(bpf_dir: str) -> None:
    """Record which source is pinned: an empty map named after its hash."""
    for name in os.listdir(bpf_dir):
        if name.startswith("source_"):
            os.unlink(os.path.join(bpf_dir, name))
    fd = bpf.map_create(bpf.MAP_TYPE_ARRAY, 4, 4, 1, name="sluice_source")
    try:
        bpf.obj_pin(fd, _marker(bpf_dir, source_hash(bpf_dir)))
    finally:
        os.close(fd)
