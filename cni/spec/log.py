"""Logging: stderr (which the runtime shows on failure) and an optional file.

sluice's loggers (``logger``) load the logging module with their first message
(``ipam.logs``), and ``setup`` installs the handlers then: a call that logs
nothing never pays for it.
"""

from __future__ import annotations

import os
import sys

from ipam import logs

FORMAT = "%(asctime)s sluice[%(process)d] %(levelname)s %(message)s"


def logger(name: str = "sluice") -> logs.Logger:
    """``logging.getLogger(name)``, loaded with its first message."""
    return logs.get(name)


def setup(log_file: str | None) -> None:
    logs.on_first_use(lambda: _install(log_file))


def _install(log_file: str | None) -> None:
    import logging

    root = logging.getLogger("sluice")
    if root.handlers:
        return
    root.setLevel(logging.DEBUG if os.environ.get("SLUICE_DEBUG") else logging.INFO)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            os.makedirs(os.path.dirname(log_file), exist_ok=True)
            handlers.append(logging.FileHandler(log_file))
        except OSError as err:
            print(f'sluice: cannot open log file "{log_file}": {err}', file=sys.stderr)
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
