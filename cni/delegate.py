"""Running a delegated plugin (an IPAM other than sluice-ipam) through CNI_PATH.

The delegate gets the caller's environment with only CNI_COMMAND changed and
the caller's stdin unchanged, as the spec requires; its stderr goes to ours.
"""

from __future__ import annotations

import json
import os
import sys

from cni.errors import ERR_DELEGATE, ERR_INVALID_ENV, CNIError
from cni.invoke import Invocation, invoke
from cni.protocol import Request
from cni.result import Result


def find_plugin(plugin_type: str, path: list[str]) -> str:
    if not path:
        raise CNIError(
            ERR_INVALID_ENV, f'CNI_PATH is empty: cannot find delegated plugin "{plugin_type}"'
        )
    for directory in path:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CNIError(ERR_DELEGATE, f'failed to find plugin "{plugin_type}" in CNI_PATH {path}')


def run(request: Request, plugin_type: str, command: str) -> str:
    """Run the delegate for ``command``; return its stdout or raise its error."""
    binary = find_plugin(plugin_type, request.plugin_path)
    env = dict(request.env)
    env["CNI_COMMAND"] = command
    try:
        proc = invoke(binary, env, request.raw_config)
    except OSError as err:
        raise CNIError(ERR_DELEGATE, f'failed to run "{binary}": {err}') from None
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.rc != 0:
        raise _delegate_error(plugin_type, command, proc)
    return proc.stdout


def _delegate_error(plugin_type: str, command: str, proc: Invocation) -> CNIError:
    """Pass the delegate's own CNI error on; wrap anything else."""
    try:
        error = proc.out
        code = int(error["code"])
        return CNIError(
            code,
            f"{plugin_type} {command}: {error.get('details') or ''}".rstrip(": "),
            msg=error.get("msg"),
        )
    except (ValueError, KeyError, TypeError):
        text = (proc.stdout or proc.stderr).strip()
        return CNIError(
            ERR_DELEGATE,
            f"{plugin_type} {command} failed with exit status {proc.rc}: {text or 'no output'}",
        )


def add(request: Request, plugin_type: str) -> Result:
    out = run(request, plugin_type, "ADD")
    try:
        data = json.loads(out)
    except json.JSONDecodeError as err:
        raise CNIError(ERR_DELEGATE, f"{plugin_type} ADD printed no JSON result: {err}") from None
    return Result.from_json(data, request.cni_version, where=f"{plugin_type} result")
