"""cni.datapath.btf reads member offsets as the kernel's BTF lays them out: through
anonymous structs and unions, typedefs and modifiers; a synthetic BTF blob stands in
for /sys/kernel/btf/vmlinux (the real one is read by the datapath tests)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cni.datapath import btf


def blob(types: list[bytes], names: list[str]) -> bytes:
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    body = b"".join(types)
    header = struct.pack("<HBBIIIII", btf.MAGIC, 1, 0, 24, 0, len(body), len(body), len(strings))
    return header + body + strings


def name_offsets(names: list[str]) -> dict[str, int]:
    offsets, at = {}, 1
    for name in names:
        offsets[name] = at
        at += len(name) + 1
    return offsets


def kind(k: int, vlen: int = 0, flag: bool = False) -> int:
    return (k << 24) | vlen | (int(flag) << 31)


def fake_vmlinux(tmp_path: Path) -> str:
    names = ["u16", "sk_buff", "len", "network_header", "head", "tail", "__u16", "bits"]
    at = name_offsets(names)
    types = [
        # 1: int u16
        struct.pack("<III", at["u16"], kind(btf.KIND_INT), 2) + struct.pack("<I", 16),
        # 2: typedef __u16 -> 1, 3: const -> 2 (modifiers on the way)
        struct.pack("<III", at["__u16"], kind(btf.KIND_TYPEDEF), 1),
        struct.pack("<III", 0, kind(btf.KIND_CONST), 2),
        # 4: anonymous struct { const __u16 network_header (at 16 bits) }
        struct.pack("<III", 0, kind(btf.KIND_STRUCT, 1), 4)
        + struct.pack("<III", at["network_header"], 3, 16),
        # 5: anonymous union { struct 4 }
        struct.pack("<III", 0, kind(btf.KIND_UNION, 1), 4) + struct.pack("<III", 0, 4, 0),
        # 6: pointer to void
        struct.pack("<III", 0, kind(btf.KIND_PTR), 0),
        # 7: struct sk_buff { u16 len; union 5 (at 64 bits); void *head (at 192); a bit
        #    field "bits" (kind_flag: size 3 at bit 200); tail at 256 }
        struct.pack("<III", at["sk_buff"], kind(btf.KIND_STRUCT, 5, True), 40)
        + struct.pack("<III", at["len"], 1, 0)
        + struct.pack("<III", 0, 5, 64)
        + struct.pack("<III", at["head"], 6, 192)
        + struct.pack("<III", at["bits"], 1, (3 << 24) | 200)
        + struct.pack("<III", at["tail"], 1, 256),
    ]
    path = tmp_path / "vmlinux"
    path.write_bytes(blob(types, names))
    return str(path)


def test_member_offsets_through_anonymous_members_and_modifiers(tmp_path: Path) -> None:
    path = fake_vmlinux(tmp_path)
    assert btf.member_offset("sk_buff", "len", path) == 0
    assert btf.member_offset("sk_buff", "network_header", path) == 8 + 2
    assert btf.member_offset("sk_buff", "head", path) == 24
    assert btf.member_offset("sk_buff", "tail", path) == 32


def test_what_cannot_be_read_is_an_error_naming_it(tmp_path: Path) -> None:
    path = fake_vmlinux(tmp_path)
    with pytest.raises(btf.BTFError, match="no member nothing"):
        btf.member_offset("sk_buff", "nothing", path)
    with pytest.raises(btf.BTFError, match="no struct nf_conn"):
        btf.member_offset("nf_conn", "status", path)
    with pytest.raises(btf.BTFError, match="bits is a bit field"):
        btf.member_offset("sk_buff", "bits", path)
    (tmp_path / "junk").write_bytes(b"\0" * 32)
    with pytest.raises(btf.BTFError, match="not BTF"):
        btf.member_offset("sk_buff", "len", str(tmp_path / "junk"))
    with pytest.raises(btf.BTFError, match="cannot read"):
        btf.member_offset("sk_buff", "len", str(tmp_path / "absent"))
