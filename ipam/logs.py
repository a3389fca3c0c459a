"""Loggers that load the logging module with their first message.

A successful plugin call logs nothing, and the logging module (with traceback,
string, weakref and warnings) costs a one-call process more than its IPAM
work. So sluice's modules log through these: ``get(name)`` is a stand-in for
``logging.getLogger(name)`` whose attributes are the real logger's, and
whoever sets up the handlers does it through ``on_first_use``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable
    from typing import Any

_pending: list[Callable[[], None]] = []


class Logger:
    """``logging.getLogger(name)``, loaded when first used."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:  # warning, error, exception, …
        return getattr(real(self.name), attribute)


def get(name: str) -> Logger:
    return Logger(name)


def real(name: str) -> logging.Logger:
    import logging

    while _pending:
        _pending.pop(0)()
    return logging.getLogger(name)


def on_first_use(configure: Callable[[], None]) -> None:
    """Run ``configure`` (which sets up handlers) before the first message of any of
    these loggers; at once if the logging module is loaded already, since other
    code may then log without them."""
    if "logging" in sys.modules:
        configure()
    else:
        _pending.append(configure)
