"""Waiting for a condition in tests that talk to processes and APIs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(
    check: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.25,
    retry_on: tuple[type[BaseException], ...] = (AssertionError,),
) -> Any:
    """Retry ``check`` until it returns something truthy; an exception of ``retry_on``
    counts as not yet. Raise AssertionError naming ``what`` and the last outcome."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except retry_on as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")
