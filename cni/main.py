"""Entry point of the ``sluice`` CNI plugin.

Only the standard library is imported here, and VERSION is answered before
even the json module is loaded (it costs more than the rest of the answer).
Each verb's module, with pyroute2, is imported only when that verb runs.
"""

from __future__ import annotations

import os
import sys

from cni import versions
from cni.errors import ERR_INTERNAL, ERR_IO, CNIError

# typing pulls in re and more; annotations are strings here, so the types are
# only imported for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

VERB_MODULES = {
    "ADD": "cni.verbs.add",
    "DEL": "cni.verbs.delete",
    "CHECK": "cni.verbs.check",
    "STATUS": "cni.verbs.status",
    "GC": "cni.verbs.gc",
}


def main() -> int:
    return run_plugin(VERB_MODULES, os.environ)


def run_plugin(verb_modules: Mapping[str, str], env: Mapping[str, str]) -> int:
    """Run one CNI call: print the result or the error JSON on stdout, return the exit code."""
    if env.get("CNI_COMMAND") == "VERSION":
        return answer_version(read_stdin_quietly())
    reply_version = versions.CURRENT
    try:
        from cni.protocol import parse_request, read_command

        command = read_command(env)
        request = parse_request(command, env, read_stdin())
        reply_version = request.cni_version
        verb = load_verb(verb_modules[command])
        return emit(verb(request))
    except CNIError as err:
        if err.code == ERR_INTERNAL or env.get("SLUICE_DEBUG"):
            _log_exception()
        emit(err.to_json(err.cni_version or reply_version))
        return 1
    except Exception as err:  # a bug: report it in the protocol, keep the trace on stderr
        _log_exception()
        emit(CNIError(ERR_INTERNAL, f"unexpected error: {err!r}").to_json(reply_version))
        return 1


def answer_version(stdin: bytes) -> int:
    echoed = versions.echoed_version(peek_version(stdin))
    supported = ", ".join(f'"{v}"' for v in versions.SUPPORTED)
    sys.stdout.write(f'{{"cniVersion": "{echoed}", "supportedVersions": [{supported}]}}\n')
    return 0


def peek_version(stdin: bytes) -> str | None:
    """The cniVersion of a VERSION request, found without a JSON parser.

    Anything unexpected yields None; only known versions are echoed.
    """
    _, found, rest = stdin.decode(errors="replace").partition('"cniVersion"')
    if not found:
        return None
    _, colon, rest = rest.partition(":")
    parts = rest.lstrip().split('"', 2)
    return parts[1] if colon and len(parts) == 3 and parts[0] == "" else None


def read_stdin() -> bytes:
    try:
        return sys.stdin.buffer.read()
    except OSError as err:
        raise CNIError(
            ERR_IO, f"failed to read the network configuration from stdin: {err}"
        ) from None


def read_stdin_quietly() -> bytes:
    try:
        return sys.stdin.buffer.read()
    except OSError:
        return b""


def load_verb(module_name: str) -> Callable[[Any], dict[str, Any] | None]:
    import importlib

    return importlib.import_module(module_name).run


def emit(payload: dict[str, Any] | None) -> int:
    if payload is not None:
        import json

        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()
    return 0


def _log_exception() -> None:
    import traceback

    traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
