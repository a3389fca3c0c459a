"""Running a delegated IPAM plugin (any IPAM but sluice-ipam) through CNI_PATH.

The delegate gets the runtime's environment with only CNI_COMMAND changed and
the runtime's stdin unchanged, as the spec requires; its stderr goes to ours.
"""

from __future__ import annotations

import json
import os
import sys

from cni.plugin.netconf import DelegatedIPAM
from cni.spec.errors import ERR_DELEGATE, ERR_INVALID_ENV, CNIError
from cni.spec.invoke import Invocation, invoke
from cni.spec.result import Result


def find_plugin(plugin_type: str, path: tuple[str, ...]) -> str:
    if not path:
        raise CNIError(
            ERR_INVALID_ENV, f'CNI_PATH is empty: cannot find delegated plugin "{plugin_type}"'
        )
    for directory in path:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CNIError(ERR_DELEGATE, f'failed to find plugin "{plugin_type}" in CNI_PATH {list(path)}')


def run(ipam: DelegatedIPAM, command: str) -> str:
    """Run the delegate for ``command``; return its stdout or raise its error."""
    binary = find_plugin(ipam.plugin_type, ipam.cni_path)
    env = {**ipam.env, "CNI_COMMAND": command}
    try:
        proc = invoke(binary, env, ipam.stdin)
    except OSError as err:
        raise CNIError(ERR_DELEGATE, f'failed to run "{binary}": {err}') from None
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.rc != 0:
        raise _delegate_error(ipam.plugin_type, command, proc)
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


def add(ipam: DelegatedIPAM, cni_version: str) -> Result:
    out = run(ipam, "ADD")
    try:
        data = json.loads(out)
    except json.JSONDecodeError as err:
        raise CNIError(
            ERR_DELEGATE, f"{ipam.plugin_type} ADD printed no JSON result: {err}"
        ) from None
    return Result.from_json(data, cni_version, where=f"{ipam.plugin_type} result")
