"""Offsets of kernel struct members, read from the running kernel's BTF.

The netfilter program (bpf/after_nat.c) reads a ``struct sk_buff``, whose layout
changes between kernel versions; the kernel headers bcc compiles against may
belong to another version than the kernel that runs (a node image's headers, a
distribution's), so the offsets come from /sys/kernel/btf/vmlinux instead and
are compiled in as constants. Only what that needs: struct and union members,
through anonymous members, modifiers and typedefs.
"""

from __future__ import annotations

import functools
import struct

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F

KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 8, 9, 10, 11
KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_TYPE_TAG = 13, 14, 15, 17, 18
KIND_ENUM64 = 19
MODIFIERS = {KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}

# Bytes that follow a type's 12-byte header: per kind, (fixed, per vlen item).
TRAILER = {
    KIND_INT: (4, 0),
    KIND_ARRAY: (12, 0),
    KIND_STRUCT: (0, 12),
    KIND_UNION: (0, 12),
    KIND_ENUM: (0, 8),
    KIND_FUNC_PROTO: (0, 8),
    KIND_VAR: (4, 0),
    KIND_DATASEC: (0, 12),
    KIND_DECL_TAG: (4, 0),
    KIND_ENUM64: (0, 12),
}


class BTFError(Exception):
    pass


class _Type:
    __slots__ = ("kind", "kind_flag", "members", "name", "ref")

    def __init__(self, name: str, kind: int, kind_flag: bool, ref: int) -> None:
        self.name, self.kind, self.kind_flag, self.ref = name, kind, kind_flag, ref
        # (name, type id, bit offset, bit field size or 0)
        self.members: list[tuple[str, int, int, int]] = []


@functools.lru_cache(maxsize=1)
def _types(path: str = VMLINUX) -> tuple[list[_Type | None], dict[str, int]]:
    """Every type (index: type id) and the ids of named structs."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as err:
        raise BTFError(f"cannot read the kernel's BTF ({path}): {err}") from None
    magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
    if magic != MAGIC:
        raise BTFError(f"{path}: not BTF (magic {magic:#x})")
    strings = hdr_len + str_off

    def name_at(offset: int) -> str:
        end = data.index(b"\0", strings + offset)
        return data[strings + offset : end].decode()

    types: list[_Type | None] = [None]  # id 0 is void
    structs: dict[str, int] = {}
    at, end = hdr_len + type_off, hdr_len + type_off + type_len
    while at < end:
        name_off, info, ref = struct.unpack_from("<III", data, at)
        at += 12
        kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31)
        typ = _Type(name_at(name_off) if name_off else "", kind, kind_flag, ref)
        fixed, per_item = TRAILER.get(kind, (0, 0))
        if kind in (KIND_STRUCT, KIND_UNION):
            for item in range(vlen):
                m_name, m_type, m_offset = struct.unpack_from("<III", data, at + 12 * item)
                bits = m_offset & 0xFFFFFF if kind_flag else m_offset
                size = m_offset >> 24 if kind_flag else 0
                typ.members.append((name_at(m_name) if m_name else "", m_type, bits, size))
            if kind == KIND_STRUCT and typ.name:
                structs.setdefault(typ.name, len(types))
        at += fixed + per_item * vlen
        types.append(typ)
    return types, structs


def member_offset(struct_name: str, member: str, path: str = VMLINUX) -> int:
    """The byte offset of ``member`` in ``struct struct_name`` (looked for through
    anonymous struct and union members)."""
    types, structs = _types(path)
    if struct_name not in structs:
        raise BTFError(f"no struct {struct_name} in the kernel's BTF")

    def resolve(type_id: int) -> _Type | None:
        typ = types[type_id]
        while typ is not None and typ.kind in MODIFIERS:
            typ = types[typ.ref]
        return typ

    def find(type_id: int, base: int) -> int | None:
        typ = resolve(type_id)
        if typ is None or typ.kind not in (KIND_STRUCT, KIND_UNION):
            return None
        for name, m_type, bits, size in typ.members:
            if name == member:
                if bits % 8 or size:
                    raise BTFError(f"struct {struct_name}: {member} is a bit field")
                return base + bits // 8
            if not name:
                found = find(m_type, base + bits // 8)
                if found is not None:
                    return found
        return None

    found = find(structs[struct_name], 0)
    if found is None:
        raise BTFError(f"struct {struct_name} has no member {member}")
    return found
