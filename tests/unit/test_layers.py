"""The packages form layers and import only downward.

Every import in the project's modules, including those inside functions, is
checked against the layer of the importing module: a module may import its
own package and lower layers, never a higher layer or a sibling package of
its own layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A name is a module or a package (all modules under it).
LAYERS: list[list[str]] = [
    ["ipam"],  # address management on its own
    ["cni.spec"],  # the CNI contract: errors, versions, requests, results
    ["cni.work"],  # background work: the work queue and its backoff
    ["cni.net"],  # netlink, namespaces, nftables
    ["cni.policy.vocabulary"],  # what a resolved policy is: the datapath compiles it
    ["cni.datapath"],  # the eBPF programs' userspace
    ["cni.policy"],  # NetworkPolicy semantics, local and published
    ["cni.plugin", "cni.kube"],  # the verbs and the plugin; the Kubernetes API client
    ["cni.controller"],  # the central resolver
    ["cni.agent"],  # the node agent
    ["cni.install"],  # launchers, the runtime copy
    ["cni.cli"],  # sluicectl
]


def unit_of(module: str) -> tuple[int, str] | None:
    """(layer, unit) of a project module; None for anything else."""
    for rank, units in enumerate(LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return rank, unit
    return None


def project_modules() -> dict[str, Path]:
    found = {}
    for package in ("cni", "ipam"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_every_module_has_a_layer() -> None:
    missing = [m for m in project_modules() if unit_of(m) is None and m not in ("cni",)]
    assert missing == []


def test_imports_go_only_downward() -> None:
    wrong = []
    for module, path in sorted(project_modules().items()):
        mine = unit_of(module)
        if mine is None:
            continue
        for imported in sorted(imports_of(module, path)):
            theirs = unit_of(imported)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] >= mine[0]:
                wrong.append(f"{module} (layer {mine[0]}) imports {imported} (layer {theirs[0]})")
    assert wrong == []


def test_ipam_never_imports_cni() -> None:
    for module, path in project_modules().items():
        if module.startswith("ipam"):
            assert not [i for i in imports_of(module, path) if i.split(".")[0] == "cni"], module


def test_the_policy_layer_needs_nothing_of_the_datapath() -> None:
    """What a policy is (``cni.policy.vocabulary``) sits below the datapath, which
    compiles it; the policy layer itself never reaches into the datapath."""
    wrong = [
        f"{module} imports {imported}"
        for module, path in sorted(project_modules().items())
        if module.startswith("cni.policy")
        for imported in sorted(imports_of(module, path))
        if imported == "cni.datapath" or imported.startswith("cni.datapath.")
    ]
    assert wrong == []
