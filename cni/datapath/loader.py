"""Compiling the datapath with bcc and pinning it: once per node.

The programs in bpf/ are compiled by whoever needs them first (``sluicectl
datapath load``, the agent, or in "policy": "off" mode the first ADD that
finds nothing pinned), under the datapath's state lock so that concurrent
callers compile once and no ADD sees a half-loaded datapath: maps and the
config map are written first, the programs are pinned last (an ADD looks
for the programs). Maps are pinned by the programs themselves (bcc reuses
a pinned map), so a reload with changed source keeps endpoints, policies
and conntrack; the new programs are pinned over the old ones and every
attached veth is switched to them, one atomic link update each.

What the maps look like (struct layouts, map definitions, compiled sizes)
is hashed into a layout marker pinned beside them. A datapath pinned with
another layout is never reused: ``load`` refuses it with a clear error
unless told to replace it, and opening a map whose key or value size
differs fails (maps.DatapathMismatch).

bcc only rewrites map calls in the main source file, so the loader inlines
the project's own headers (``#include "x.h"``) into one text first.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cni.datapath import after_nat, bpf, bpf_links, bpf_programs
from cni.datapath.maps import MAPS, NF_PROGRAMS, PROGRAMS, Datapath, DatapathMismatch
from cni.datapath.settings import DatapathSettings
from cni.spec.errors import ERR_KERNEL, CNIError
from cni.spec.log import logger

log = logger("sluice")

SOURCE_DIR = Path(__file__).resolve().parent.parent.parent / "bpf"
BPFFS_ROOT = "/sys/fs/bpf"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
CFLAGS = ["-Wno-unused-function", "-Wno-macro-redefined"]
LAYOUT_FILES = ("vocabulary.h", "sluice.h", "maps.h")


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
    """Every entry file in one compilation unit (one compile, shared helpers)."""
    seen: set[Path] = set()
    return "".join(
        inline_includes(SOURCE_DIR / f"{name}.c", seen) for name in (*PROGRAMS, *NF_PROGRAMS)
    )


def source_hash(bpf_dir: str, settings: DatapathSettings | None = None) -> str:
    digest = hashlib.sha256(program_source().encode())
    digest.update(bpf_dir.encode())
    digest.update(layout_hash(settings).encode())
    return digest.hexdigest()[:16]


def layout_hash(settings: DatapathSettings | None = None) -> str:
    """What pinned maps must agree on: struct layouts, map definitions, sizes."""
    settings = settings or DatapathSettings()
    digest = hashlib.sha256()
    for name in LAYOUT_FILES:
        digest.update((SOURCE_DIR / name).read_bytes())
    digest.update(repr(sorted(settings.compiled().items())).encode())
    return digest.hexdigest()[:16]


def mount_type(mounts: str, path: str) -> str | None:
    """The type of the topmost mount at ``path`` in a /proc/self/mounts text, None when
    nothing is mounted there."""
    types = [f[2] for f in (line.split() for line in mounts.splitlines()) if f[1:2] == [path]]
    return types[-1] if types else None


def ensure_bpffs() -> None:
    """bcc pins under /sys/fs/bpf; mount bpffs there if the node has not.

    Where /sys/fs/bpf is a mount of something else (a container's hostPath of a node
    that has no bpffs there), a bpffs mounted over it would live and die with this
    process's mount namespace, the pins with it: refused instead."""
    with open("/proc/self/mounts") as mounts:
        mounted = mount_type(mounts.read(), BPFFS_ROOT)
    if mounted == "bpf":
        return
    if mounted is not None:
        raise CNIError(
            ERR_KERNEL,
            f'"{BPFFS_ROOT}" is a mount of {mounted}, not bpffs: mount bpffs there on the '
            f"node (mount -t bpf bpf {BPFFS_ROOT}) so the pinned datapath outlives this "
            "process",
        )
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", BPFFS_ROOT.encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise CNIError(ERR_KERNEL, f'failed to mount bpffs at "{BPFFS_ROOT}": {os.strerror(err)}')


@contextmanager
def load_lock(bpf_dir: str) -> Iterator[Datapath]:
    """A handle on the datapath with its state lock held, bpffs mounted first."""
    ensure_bpffs()
    with Datapath(bpf_dir) as datapath, datapath.lock:
        yield datapath


def _marker(bpf_dir: str, kind: str, digest: str) -> str:
    return os.path.join(bpf_dir, f"{kind}_{digest}")


def pinned_layout(bpf_dir: str) -> str | None:
    """The layout marker's hash, "" for maps pinned without one, None if nothing is."""
    try:
        names = os.listdir(bpf_dir)
    except FileNotFoundError:
        return None
    for name in names:
        if name.startswith("layout_"):
            return name.removeprefix("layout_")
    return "" if any(name in names for name in MAPS) else None


def is_current(bpf_dir: str, settings: DatapathSettings | None = None) -> bool:
    """Pinned, and from the source and layout this sluice has (markers say)."""
    with Datapath(bpf_dir) as datapath:
        loaded = datapath.is_loaded()
    return loaded and os.path.exists(_marker(bpf_dir, "source", source_hash(bpf_dir, settings)))


def ensure_loaded(bpf_dir: str, settings: DatapathSettings | None = None) -> bool:
    """Load the datapath unless it is pinned already; True if this call compiled it.

    A datapath pinned with another layout is not replaced here: opening its
    maps fails with a clear error (sluicectl datapath load --replace)."""
    with Datapath(bpf_dir) as datapath:
        if datapath.is_loaded():
            return False
    with load_lock(bpf_dir) as datapath:
        if datapath.is_loaded():  # another process compiled it meanwhile
            return False
        _refuse_other_layout(bpf_dir, settings)
        _load(datapath, settings or DatapathSettings())
    return True


def load(
    bpf_dir: str,
    force: bool = False,
    settings: DatapathSettings | None = None,
    replace: bool = False,
) -> bool:
    """Compile and pin unless the pinned programs come from this source; True if loaded.

    The tunables of ``settings`` are written to the config map either way.
    ``replace``: a datapath pinned with another layout is unpinned and loaded
    anew; its endpoints keep their links, now to the new programs, and drop
    every packet until they are registered again (fail closed)."""
    settings = settings or DatapathSettings()
    with load_lock(bpf_dir) as datapath:
        stale: list[int] = []
        if replace and pinned_layout(bpf_dir) not in (None, layout_hash(settings)):
            stale = _unpin_all(bpf_dir)
        _refuse_other_layout(bpf_dir, settings)
        if is_current(bpf_dir, settings) and not force:
            datapath.set_config(**settings.config_fields())
            return False
        _load(datapath, settings, stale)
    return True


def _refuse_other_layout(bpf_dir: str, settings: DatapathSettings | None) -> None:
    pinned, ours = pinned_layout(bpf_dir), layout_hash(settings)
    if pinned not in (None, ours):
        raise CNIError(
            ERR_KERNEL,
            f'the datapath pinned in "{bpf_dir}" has layout {pinned or "(unmarked)"}, '
            f"this sluice and its settings need {ours} (struct layouts or map sizes "
            "changed); refusing to reuse it: run `sluicectl datapath load --replace` "
            "(attached pods drop all traffic until they are registered again)",
        )


def _unpin_all(bpf_dir: str) -> list[int]:
    """Unpin an incompatible datapath, keeping the links (switched to the new programs
    once they are pinned); return their endpoints."""
    from cni.datapath.attach import UPLINK_HOOKS

    links = os.path.join(bpf_dir, "links")
    uplink_programs = tuple(f"_{program}" for program in UPLINK_HOOKS)
    kept = sorted(
        {int(p.split("_", 1)[0]) for p in os.listdir(links) if not p.endswith(uplink_programs)}
        if os.path.isdir(links)
        else set()
    )
    for name in os.listdir(bpf_dir):
        path = os.path.join(bpf_dir, name)
        if name in ("links", after_nat.LINKS):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    return kept


def _load(datapath: Datapath, settings: DatapathSettings, stale: list[int] | None = None) -> None:
    """Compile and pin into ``datapath`` (its lock held; no map of it opened yet)."""
    bpf_dir = datapath.bpf_dir
    started = time.monotonic()
    try:
        from bcc import BPF
    except ImportError as err:
        raise CNIError(
            ERR_KERNEL,
            f"failed to load the datapath: bcc is not available ({err}); install "
            "python3-bpfcc, or have the agent (or `sluicectl datapath load`) pin the "
            "datapath where bcc is",
        ) from None
    defines = [f"-D{name}={value}" for name, value in settings.compiled().items()]
    skb = skb_offsets()
    unknown = {**SKB_UNKNOWN, **dict.fromkeys(OPTIONAL_MEMBERS, -1)}
    defines += [f"-D{name}={value}" for name, value in (skb or unknown).items()]
    try:
        module = BPF(
            text=program_source().encode(),
            cflags=[*CFLAGS, *defines, f'-DSL_PIN_DIR="{bpf_dir}"'],
        )
        functions = {name: module.load_func(name.encode(), BPF.SCHED_CLS) for name in PROGRAMS}
    except Exception as err:
        raise CNIError(
            ERR_KERNEL, f'failed to compile the datapath into "{bpf_dir}": {err}'
        ) from None
    for name in NF_PROGRAMS if skb else ():
        try:
            functions[name] = module.load_func(
                name.encode(), bpf_programs.PROG_TYPE_NETFILTER, attach_type=bpf_links.NETFILTER
            )
        except Exception as err:  # an older kernel: service flows stay refused (services.h)
            log.warning("the kernel refused %s (netfilter programs need 6.4): %s", name, err)
    try:
        # Config and markers first: the programs' pins are what an ADD looks for.
        datapath.set_config(**settings.config_fields())
        endpoints = list(datapath.endpoints.all())
        _pin_markers(bpf_dir, settings)
        for name, function in functions.items():
            # Pin beside, then rename over the old pin: never a moment without one.
            staging = os.path.join(bpf_dir, f"{name}_new")  # bpffs refuses names with a dot
            if os.path.exists(staging):
                os.unlink(staging)
            bpf.obj_pin(function.fd, staging)
            os.replace(staging, os.path.join(bpf_dir, name))
    except DatapathMismatch as err:
        raise CNIError(ERR_KERNEL, str(err)) from None
    switched = sorted(set(endpoints) | set(stale or ()))
    if switched or os.path.isdir(os.path.join(bpf_dir, "links")):
        from cni.datapath.program_switch import switch_programs

        switch_programs(datapath, switched)
    if os.path.isdir(os.path.join(bpf_dir, after_nat.LINKS)):
        try:
            after_nat.attach(datapath)  # new links for the new program
        except bpf.BPFError as err:
            log.warning("after_nat is not on netfilter's hooks: %s", err)
    log.info(
        "datapath compiled and pinned in %s (%.1f s, %d endpoints switched)",
        bpf_dir,
        time.monotonic() - started,
        len(switched),
    )
    module.cleanup()


# struct sk_buff members bpf/skb.h reads, and their offsets when the kernel has no BTF
# (after_nat is then not loaded).
SKB_MEMBERS = {
    "SL_SKB_HEAD": "head",
    "SL_SKB_TAIL": "tail",
    "SL_SKB_NETWORK_HEADER": "network_header",
    "SL_SKB_NFCT": "_nfct",
}
SKB_UNKNOWN = dict.fromkeys(SKB_MEMBERS, 0)
# Read where the kernel has them: nf_conn lives in the nf_conntrack module's BTF where
# conntrack is a module (-1: unknown, and bpf/skb.h does without).
OPTIONAL_MEMBERS = {
    "SL_NF_HOOK_STATE_HOOK": ("nf_hook_state", "hook"),
    "SL_NF_CONN_STATUS": ("nf_conn", "status"),
}


def skb_offsets() -> dict[str, int] | None:
    """The running kernel's offsets bpf/skb.h needs (None: no BTF)."""
    from cni.datapath import btf

    try:
        found = {define: btf.member_offset("sk_buff", m) for define, m in SKB_MEMBERS.items()}
    except btf.BTFError as err:
        log.warning("no netfilter program: %s", err)
        return None
    for define, (struct, member) in OPTIONAL_MEMBERS.items():
        try:
            found[define] = btf.member_offset(struct, member)
        except btf.BTFError:
            found[define] = -1
    return found


def _pin_markers(bpf_dir: str, settings: DatapathSettings) -> None:
    """Record which source and layout are pinned: empty maps named after their hashes."""
    for name in os.listdir(bpf_dir):
        if name.startswith(("source_", "layout_")):
            os.unlink(os.path.join(bpf_dir, name))
    for kind, digest in (
        ("layout", layout_hash(settings)),
        ("source", source_hash(bpf_dir, settings)),
    ):
        fd = bpf.map_create(bpf.MAP_TYPE_ARRAY, 4, 4, 1, name=f"sluice_{kind}")
        try:
            bpf.obj_pin(fd, _marker(bpf_dir, kind, digest))
        finally:
            os.close(fd)
