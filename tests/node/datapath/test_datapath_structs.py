"""The C structs of bpf/sluice.h and their Python mirrors agree byte for byte."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

from cni.datapath import structs
from cni.datapath.vocabulary import Direction, Reason

HEADER = Path(__file__).resolve().parents[3] / "bpf" / "sluice.h"


def c_layout(tmp_path: Path) -> dict[str, tuple[int, dict[str, int]]]:
    """sizeof and offsetof of every struct field, as clang lays them out for the host."""
    source = HEADER.read_text()
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        f'#include "{HEADER}"',
        "int main(void) {",
    ]
    for name, mirror in structs.MIRRORS.items():
        assert re.search(rf"struct {name} \{{", source), f"struct {name} is not in sluice.h"
        lines.append(f'printf("{name} size %zu\\n", sizeof(struct {name}));')
        for field, _ in mirror._fields_:
            lines.append(f'printf("{name} {field} %zu\\n", offsetof(struct {name}, {field}));')
    lines.append("return 0; }")
    program = tmp_path / "layout.c"
    program.write_text("\n".join(lines))
    binary = tmp_path / "layout"
    subprocess.run(["clang", "-o", binary, program], check=True)
    layout: dict[str, tuple[int, dict[str, int]]] = {}
    for line in subprocess.run(
        [binary], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        name, field, value = line.split()
        size, offsets = layout.get(name, (0, {}))
        if field == "size":
            layout[name] = (int(value), offsets)
        else:
            offsets[field] = int(value)
            layout[name] = (size, offsets)
    return layout


def test_c_structs_match_python_mirrors(tmp_path: Path) -> None:
    layout = c_layout(tmp_path)
    for name, mirror in structs.MIRRORS.items():
        size, offsets = layout[name]
        assert ctypes.sizeof(mirror) == size, f"{name}: Python {ctypes.sizeof(mirror)}, C {size}"
        for field, _ in mirror._fields_:
            assert getattr(mirror, field).offset == offsets[field], f"{name}.{field}"


def test_every_c_struct_has_a_mirror() -> None:
    declared = set(re.findall(r"^struct (sl_\w+) \{", HEADER.read_text(), re.M))
    assert declared == set(structs.MIRRORS)


VOCABULARY = HEADER.parent / "vocabulary.h"


def c_defines(path: Path) -> dict[str, int]:
    return {
        name: int(value)
        for name, value in re.findall(r"^#define (SL_\w+)\s+(\d+)\b", path.read_text(), re.M)
    }


def test_directions_and_reasons_match_the_python_enums() -> None:
    defines = c_defines(VOCABULARY)
    directions = {
        k.removeprefix("SL_DIR_"): v for k, v in defines.items() if k.startswith("SL_DIR_")
    }
    reasons = {
        k.removeprefix("SL_"): v
        for k, v in defines.items()
        if not k.startswith("SL_DIR") and k != "SL_REASONS"
    }
    assert directions == {d.name: d.value for d in Direction}
    assert reasons == {r.name: r.value for r in Reason}
    assert defines["SL_DIRS"] == len(Direction) and defines["SL_REASONS"] == len(Reason)
    assert tuple(r.label for r in sorted(Reason)) == structs.REASONS


def test_every_c_macro_has_the_project_prefix() -> None:
    for path in HEADER.parent.glob("*.[ch]"):
        for name in re.findall(r"^#\s*define\s+(\w+)", path.read_text(), re.M):
            assert name.startswith(("SL_", "__SL")) or name == "__SLUICE_H__", (
                f"{path.name}: {name}"
            )
