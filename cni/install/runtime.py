"""A Python of sluice's own for nodes that have none (kind's node image, say).

``sluicectl install --runtime DIR`` copies into DIR everything the ``sluice``
and ``sluice-ipam`` executables need, so that they run without the node's
Python, its libraries or this checkout:

- ``bin/``: this interpreter;
- ``lib/``: the shared libraries the interpreter and its extension modules
  link, with the dynamic loader itself (the C library must match the loader
  it was built for, so both come from here, never from the node);
- ``lib/python3.X/``: the standard library (without its tests, IDLE and Tk);
- ``site/``: the packages the plugin imports (sluice's and pyroute2), and the
  datapath's C sources (``bpf/``), which the plugin hashes.

The launchers start the interpreter through the copied loader::

    DIR/lib/ld-linux-x86-64.so.2 --library-path DIR/lib DIR/bin/python3.X -IS ...

and the interpreter finds its standard library next to itself (the
``lib/python3.X/os.py`` landmark), so only DIR's own path is written into
them. The datapath's compiler (bcc and LLVM) is not copied: on such a node the
agent, or ``sluicectl datapath load``, pins the datapath, and the plugin only
attaches what is pinned.

Each copy holds a marker file (``MARKER``). A copy replaces only what is sluice's
own: nothing, an empty directory, or a copy with its marker. Anything else at
DIR (``/opt/cni/bin`` given by mistake, a directory of someone else's files) is
refused and left as it is.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable
from pathlib import Path

# What the plugin's executables import, in any verb: sluice's own packages and
# pyroute2 (its netlink errors, and requests sluice does not pack itself). The
# agent, sluicectl and their other dependencies run where sluice is installed.
PACKAGES = ("cni", "ipam", "pyroute2")
SOURCES = Path(__file__).resolve().parents[2] / "bpf"  # next to the packages, as here
CTYPES_SONAMES = ("libnftables.so.1",)  # what the plugin loads with ctypes (cni.net.nftables)
LIBRARY_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
STDLIB_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "venv"}
# ldd's lines: "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)".
LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


MARKER = ".sluice-runtime"  # in every copy: what a later install may replace


class RuntimeCopyError(Exception):
    """The runtime could not be copied (a library ldd cannot resolve, say)."""


def interpreter() -> Path:
    """The real interpreter behind this process (a venv's python is a symlink)."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def python_dir_name() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def linked_libraries(elf_files: Iterable[Path]) -> tuple[set[Path], Path | None]:
    """(the shared libraries these ELF files link, the dynamic loader), as ldd
    resolves them on this machine."""
    libraries: set[Path] = set()
    loader: Path | None = None
    for path in elf_files:
        proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            continue  # not dynamic (a static extension module, say)
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise RuntimeCopyError(f"{path} needs a library this machine lacks: {line.strip()}")
            match = LDD_LINE.match(line)
            if not match:
                continue  # linux-vdso.so.1, which the kernel provides
            found = Path(match.group(1))
            if "=>" in line:
                libraries.add(found)
            else:
                loader = found
    return libraries, loader


def extension_dir() -> Path:
    """lib-dynload: where the standard library's C extension modules are."""
    spec = importlib.util.find_spec("_ctypes")
    if spec is None or spec.origin is None:
        raise RuntimeCopyError("this Python has no _ctypes extension module to locate lib-dynload")
    return Path(spec.origin).parent


def copy_runtime(destination: str) -> str:
    """Copy the runtime to ``destination``, a symbolic link to a directory of this
    copy, switched in one rename: a plugin starting meanwhile runs the old copy or the
    new one, never half of either. The copy it replaces is removed. Returns the file
    name of the dynamic loader in ``lib/``, which the launchers exec."""
    final = Path(destination)
    check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{final.name}.{os.getpid()}.{time.time_ns()}")
    lib = staging / "lib"
    stdlib = lib / python_dir_name()
    site = staging / "site"
    for directory in (staging / "bin", lib, site):
        directory.mkdir(parents=True)
    try:
        loader = _fill(staging, lib, stdlib, site)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / MARKER).write_text(f"a Python of sluice's own, copied by {python_dir_name()}\n")
    previous = os.path.realpath(final) if final.is_symlink() else None
    if final.exists() and not final.is_symlink():
        shutil.rmtree(final)  # an empty directory or a copy of ours: the link takes its place
    link = final.with_name(f".{final.name}.link.{os.getpid()}")
    os.symlink(staging.name, link)
    os.replace(link, final)
    if previous and previous != str(staging) and _is_copy(Path(previous), final):
        shutil.rmtree(previous, ignore_errors=True)
    return loader


def check_replaceable(final: Path) -> None:
    """Raise RuntimeCopyError unless what is at ``final`` is sluice's to replace."""
    if not os.path.lexists(final):
        return
    if final.is_symlink():
        target = Path(os.path.realpath(final))
        if target.is_dir() and _is_copy(target, final):
            return
        raise RuntimeCopyError(
            f"{final} is a link to {target}, which is not a runtime copy of sluice's "
            f"(no {MARKER} in a sibling .{final.name}.* directory): refusing to replace it"
        )
    if not final.is_dir():
        raise RuntimeCopyError(
            f"{final} is a file, not a runtime directory: refusing to replace it"
        )
    if (final / MARKER).is_file():
        return
    found = sorted(os.listdir(final))
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise RuntimeCopyError(
            f"{final} holds files that are not sluice's ({shown}; no {MARKER}): "
            "refusing to delete them; give --runtime a directory of its own"
        )


def _is_copy(directory: Path, final: Path) -> bool:
    """A copy made by copy_runtime for ``final``: next to it, named after it, marked
    (or, made before copies had a marker, holding sluice's own package in ``site/``)."""
    return (
        directory.parent == Path(os.path.realpath(final.parent))
        and directory.name.startswith(f".{final.name}.")
        and ((directory / MARKER).is_file() or (directory / "site" / "cni" / "plugin").is_dir())
    )


def _fill(staging: Path, lib: Path, stdlib: Path, site: Path) -> str:
    python = interpreter()
    shutil.copy2(python, staging / "bin" / python_dir_name())
    source_stdlib = sysconfig.get_paths()["stdlib"]

    def skipped(directory: str, names: list[str]) -> set[str]:
        if directory != source_stdlib:
            return set()
        return {
            n
            for n in names
            if n in STDLIB_SKIPPED or n.startswith(("site-packages", "dist-packages", "config-"))
        }

    shutil.copytree(source_stdlib, stdlib, ignore=skipped)
    dynload = stdlib / "lib-dynload"
    if not dynload.exists():
        shutil.copytree(extension_dir(), dynload)
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeCopyError(f"package {package!r} is not importable here")
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, site / package, ignore=shutil.ignore_patterns("__pycache__"))

    # The datapath's C sources: the plugin hashes them to tell whether what is pinned
    # matches its layout (it never compiles them here: bcc is not copied).
    shutil.copytree(SOURCES, site / SOURCES.name)

    # libnftables, which the plugin loads with ctypes to masquerade: found in the
    # runtime's lib/ first, so the node needs neither it nor the nft command.
    loaded = [
        found for found in (_find_library(soname) for soname in CTYPES_SONAMES) if found is not None
    ]
    elf_files = [python, *dynload.glob("*.so"), *site.rglob("*.so"), *loaded]
    libraries, loader = linked_libraries(elf_files)
    libraries.update(loaded)
    if loader is None:
        raise RuntimeCopyError(f"ldd named no dynamic loader for {python}")
    for library in [*libraries, loader]:
        shutil.copy2(library, lib / library.name)  # follows symlinks: the file itself
    # Bytecode now, so that no plugin call compiles (or writes into the runtime).
    subprocess.run(
        [str(python), "-I", "-S", "-m", "compileall", "-q", "-j", "0", str(site), str(stdlib)],
        check=False,
        capture_output=True,
    )
    return loader.name


def _find_library(soname: str) -> Path | None:
    for directory in LIBRARY_DIRS:
        candidate = Path(directory) / soname
        if candidate.exists():
            return candidate
    return None
