"""A list response read an item at a time, however its bytes are cut."""

from __future__ import annotations

import json

import pytest

from cni.kube.liststream import ListFormatError, list_members

LIST = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "42", "continue": "abc"},
    "items": [
        {"metadata": {"name": f"p{i}", "labels": {"app": "é✓"}}, "n": [i, 1.5, None, True]}
        for i in range(7)
    ],
}


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 100_000])
@pytest.mark.parametrize("indent", [None, 2])
def test_every_member_and_item_in_order_whatever_the_chunks(size: int, indent: int | None) -> None:
    data = json.dumps(LIST, indent=indent, ensure_ascii=False).encode()
    members = list(list_members(cut(data, size)))
    assert members[:3] == [
        ("kind", "PodList"),
        ("apiVersion", "v1"),
        ("metadata", LIST["metadata"]),
    ]
    assert [value for member, value in members[3:]] == LIST["items"]
    assert {member for member, _ in members[3:]} == {"item"}


@pytest.mark.parametrize("text", ['{"items":[]}', '{"items": [ ] , "metadata": {}}', "{}"])
def test_empty_lists(text: str) -> None:
    assert [m for m, _ in list_members([text.encode()]) if m == "item"] == []


def test_a_number_cut_at_a_chunk_boundary_is_read_whole() -> None:
    assert list(list_members([b'{"a": 12', b"34}"])) == [("a", 1234)]


@pytest.mark.parametrize(
    "text", ['{"items":[{"a":1}', "[1, 2]", '{"items":[{"a":1} {"b":2}]}', '{"a":1 "b":2}', ""]
)
def test_what_is_not_a_list_says_what_it_found(text: str) -> None:
    with pytest.raises(ListFormatError):
        list(list_members(cut(text.encode(), 3)))


def test_bytes_that_are_not_utf8_are_a_format_error() -> None:
    with pytest.raises(ListFormatError, match="not UTF-8"):
        list(list_members([b'{"items":["\xff\xfe"]}']))
