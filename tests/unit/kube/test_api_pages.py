"""Api.pages: batches as items arrive, server pages followed with what a continued
request may carry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cni.kube import api as api_module
from cni.kube.api import Api, ApiError


class PagedApi(Api):
    """Two server pages of three items; records each request's query."""

    def __init__(self) -> None:  # no client: _list_stream is replaced
        self.queries: list[dict[str, str]] = []

    def _list_stream(self, path: str, query: dict[str, str]) -> Iterator[tuple[str, Any]]:
        self.queries.append(dict(query))
        first = "continue" not in query
        meta = {"resourceVersion": "7", **({"continue": "token"} if first else {})}
        yield "metadata", meta
        for i in range(3):
            yield "item", {"n": i if first else 3 + i}


def test_batches_and_continued_pages(monkeypatch: Any) -> None:
    monkeypatch.setattr(api_module, "BATCH", 2)
    api = PagedApi()
    pages = list(
        api.pages("/api/v1/pods", resourceVersion="5", resourceVersionMatch="NotOlderThan")
    )
    assert [[item["n"] for item in page] for page, _ in pages] == [[0, 1], [2], [3, 4], [5]]
    assert {version for _, version in pages} == {"7"}
    first, second = api.queries
    assert first == {"limit": "500", "resourceVersion": "5", "resourceVersionMatch": "NotOlderThan"}
    # The server refuses a resourceVersion or its match with a continue token.
    assert second == {"limit": "500", "continue": "token"}


@pytest.mark.parametrize(
    ("body", "error"),
    [(b"<html>bad gateway</html>", "not JSON"), (b"[1, 2]", "a list, not an object")],
)
def test_an_answer_that_is_not_a_json_object_is_an_api_error(body: bytes, error: str) -> None:
    """Not an exception of another kind, which would end the thread that asked."""
    with pytest.raises(ApiError, match=error):
        api_module._json_object(body, "GET /apis/coordination.k8s.io/v1/leases/x")
