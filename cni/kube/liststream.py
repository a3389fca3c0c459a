"""A list response of the API decoded one item at a time, from its bytes in chunks.

The API server's watch cache answers a list at ``resourceVersion=0`` in one
piece whatever ``limit`` asks: 10,000 pods are 25 MB of JSON, and 108 MB once
``json.loads`` has made Python objects of all of it. Decoded here, only one
item is a Python object at a time (the caller trims it before the next), and
only a chunk of the text is held (``Api`` holds the body compressed).

A list is an object whose members are decoded whole, except ``items``, an
array whose elements are decoded one by one. The server writes ``metadata``
(with the list's resourceVersion) before ``items``.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import Any

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


class ListFormatError(ValueError):
    """The response is not a JSON object of the shape a list has."""


class _Text:
    """The response's text so far, consumed from ``pos``; more is read on demand."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.ended = False

    def more(self) -> bool:
        """Read another chunk; False at the end of the response."""
        if self.ended:
            return False
        # Drop what is consumed, now and then (each drop copies the rest).
        if self.pos > 65536 and self.pos * 2 > len(self.text):
            self.text, self.pos = self.text[self.pos :], 0
        try:
            for chunk in self._chunks:
                decoded = self._utf8.decode(chunk)
                if decoded:
                    self.text += decoded
                    return True
            self.text += self._utf8.decode(b"", final=True)
        except UnicodeDecodeError as err:
            raise ListFormatError(f"the response is not UTF-8: {err}") from None
        self.ended = True
        return True

    def skip_space(self) -> str:
        """The next significant character (consumed), or "" at the end."""
        while True:
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < len(text):
                self.pos += 1
                return text[pos]
            if not self.more():
                return ""

    def expect(self, wanted: str, where: str) -> None:
        found = self.skip_space()
        if found != wanted:
            raise ListFormatError(
                f"expected {wanted!r} {where} at offset {self.pos}, found {found or 'the end'!r}"
            )

    def peek(self) -> str:
        found = self.skip_space()
        if found:
            self.pos -= 1
        return found

    def value(self) -> Any:
        """The next JSON value, whole. A value is complete once something follows it
        (a number at the end of the buffer might go on in the next chunk)."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:
                if self.more():
                    continue
                raise ListFormatError(f"the response ends inside a value: {err}") from None
            if end < len(self.text) or self.ended:
                self.pos = end
                return value
            self.more()


def list_members(chunks: Iterable[bytes]) -> Iterator[tuple[str, Any]]:
    """(member, value) of a list response in order, but ``("item", each item)`` in
    place of ``items``."""
    text = _Text(chunks)
    text.expect("{", "at the start of a list")
    if text.peek() == "}":
        return
    while True:
        key = text.value()
        if not isinstance(key, str):
            raise ListFormatError(f"expected a member name, found {key!r}")
        text.expect(":", f"after {key!r}")
        if key == "items" and text.peek() == "[":
            text.expect("[", "")
            if text.peek() == "]":
                text.expect("]", "")
            else:
                while True:
                    yield "item", text.value()
                    separator = text.skip_space()
                    if separator == "]":
                        break
                    if separator != ",":
                        raise ListFormatError(
                            f"expected ',' or ']' in items, found {separator or 'the end'!r}"
                        )
        else:
            yield key, text.value()
        separator = text.skip_space()
        if separator == "}":
            return
        if separator != ",":
            raise ListFormatError(f"expected ',' or '}}' after {key!r}, found {separator!r}")
