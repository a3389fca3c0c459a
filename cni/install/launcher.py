"""The launcher ``sluicectl install`` writes into the CNI bin directory.

The runtime execs the plugin once per call, so start-up time counts. The
launcher runs the interpreter with ``-I -S`` (no site processing, no user or
environment paths) and puts only sluice's code and its dependencies on
sys.path; the entry module then imports nothing beyond the standard library
until a verb needs it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig

SHELL_SAFE = re.compile(r"[A-Za-z0-9/._+-]+")

TEMPLATE = """#!{python} -IS
# sluice CNI plugin launcher, written by `sluicectl install`.
import sys
sys.path[:0] = {paths!r}
from {module} import main
sys.exit(main())
"""

# With a runtime of sluice's own (``cni.install.runtime``), for nodes without Python: the
# copied interpreter through the copied dynamic loader (the shell only execs).
RUNTIME_TEMPLATE = """#!/bin/sh
# sluice CNI plugin launcher, written by `sluicectl install --runtime`.
exec {runtime}/lib/{loader} --library-path {runtime}/lib {runtime}/bin/{python} -IS -c \\
  'import sys; sys.path[:0] = ["{site}"]; from {module} import main; sys.exit(main())'
"""

ENTRY_POINTS = {"sluice": "cni.plugin.main", "sluice-ipam": "cni.plugin.ipam_plugin"}


def import_paths() -> list[str]:
    """Where sluice's packages and its dependencies live: the project, the environment's
    packages, and last the system's (bcc comes from the distribution, for the one
    compile of the datapath on a node without an agent)."""
    spec = importlib.util.find_spec("cni")
    assert spec is not None and spec.origin is not None
    paths = [os.path.dirname(os.path.dirname(spec.origin)), sysconfig.get_paths()["purelib"]]
    bcc = importlib.util.find_spec("bcc")
    if bcc is not None and bcc.submodule_search_locations:
        paths.append(os.path.dirname(next(iter(bcc.submodule_search_locations))))
    return list(dict.fromkeys(paths))


def render(executable: str) -> str:
    return TEMPLATE.format(
        python=sys.executable, paths=import_paths(), module=ENTRY_POINTS[executable]
    )


def render_for_runtime(executable: str, runtime: str, loader: str, python: str) -> str:
    """The launcher of a runtime copied to ``runtime`` (the node's path)."""
    for value in (runtime, loader, python):
        if not SHELL_SAFE.fullmatch(value):
            raise ValueError(f"{value!r}: only letters, digits and /._+- go into a launcher")
    return RUNTIME_TEMPLATE.format(
        runtime=runtime,
        loader=loader,
        python=python,
        site=f"{runtime}/site",
        module=ENTRY_POINTS[executable],
    )


def write(bin_dir: str, executable: str, text: str | None = None) -> str:
    """Write atomically, so a runtime never execs a half-written launcher; ``text``:
    what ``render_for_runtime`` made, else the launcher of this interpreter."""
    path = os.path.join(bin_dir, executable)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(render(executable) if text is None else text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path
