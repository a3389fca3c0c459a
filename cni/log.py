"""Logging: stderr (which the runtime shows on failure) and an optional file."""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s sluice[%(process)d] %(levelname)s %(message)s"


def setup(log_file: str | None) -> None:
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
