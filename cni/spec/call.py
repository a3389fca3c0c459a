"""One CNI call, from the runtime's environment and stdin to the exit code and
stdout: parsing, the verb, and the error JSON for whatever goes wrong. The
plugin's own process and the agent both run calls through ``execute``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from cni.spec import versions
from cni.spec.errors import ERR_INTERNAL, CNIError
from cni.spec.protocol import Request, parse_request, read_command


def execute(
    env: Mapping[str, str], stdin: bytes, run_verb: Callable[[Request], dict[str, Any] | None]
) -> tuple[int, str]:
    """One CNI call: (exit code, stdout). The plugin and the agent both run calls here."""
    reply_version = versions.CURRENT
    try:
        request = parse_request(read_command(env), env, stdin)
        reply_version = request.cni_version
        return 0, render(run_verb(request))
    except CNIError as err:
        if err.code == ERR_INTERNAL or env.get("SLUICE_DEBUG"):
            _print_traceback()
        return 1, render(err.to_json(err.cni_version or reply_version))
    except Exception as err:  # a bug: report it in the protocol, keep the trace on stderr
        _print_traceback()
        internal = CNIError(ERR_INTERNAL, f"unexpected error: {err!r}")
        return 1, render(internal.to_json(reply_version))


def render(payload: dict[str, Any] | None) -> str:
    if payload is None:
        return ""
    return json.dumps(payload, indent=2) + "\n"


def _print_traceback() -> None:
    import traceback  # only on failure: it pulls in textwrap and more

    traceback.print_exc(file=sys.stderr)
