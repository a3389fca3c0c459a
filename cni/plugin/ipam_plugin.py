"""Entry point of ``sluice-ipam``: sluice's IPAM as a CNI IPAM plugin.

Main plugins such as ptp or bridge exec it like host-local: ADD answers with
addresses and routes (no interfaces), DEL releases, CHECK verifies the
reservation, STATUS says whether an address is left, GC releases what is not
in ``cni.dev/valid-attachments``. The store is the one sluice itself uses.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cni.plugin.main import (
    answer_version,
    emit_error,
    read_stdin,
    read_stdin_quietly,
    run_plugin,
    stdin_error,
)
from cni.spec.versions import CURRENT

VERB_MODULES = {verb: "cni.plugin.ipam_plugin" for verb in ("ADD", "DEL", "CHECK", "STATUS", "GC")}


def main() -> int:
    if os.environ.get("CNI_COMMAND") == "VERSION":
        return answer_version(read_stdin_quietly())
    try:
        stdin = read_stdin()
    except OSError as err:
        return emit_error(stdin_error(err), CURRENT)
    return run_plugin(VERB_MODULES, os.environ, stdin)


def run(request: Any) -> dict[str, Any] | None:
    """Serve one verb (the module is its own verb table)."""
    from cni.plugin.ipam_client import BuiltinClient
    from cni.spec import log
    from cni.spec.errors import from_ipam
    from cni.spec.protocol import prev_result, valid_attachments
    from ipam import config as ipam_config
    from ipam.errors import IPAMError

    log.setup(None)
    try:
        config = ipam_config.from_plugin(request.network, request.config)
    except IPAMError as err:
        raise from_ipam(err) from None
    attachment = request.attachment
    with BuiltinClient(config, request.cni_version) as ipam:
        if request.command == "ADD":
            result, _ = ipam.add(attachment)
            return result.to_json(request.cni_version)
        if request.command == "DEL":
            ipam.delete(attachment)
        elif request.command == "CHECK":
            prev = prev_result(request)
            ipam.check(attachment, prev.ips if prev else [])
        elif request.command == "STATUS":
            ipam.status()
        elif request.command == "GC":
            ipam.gc(valid_attachments(request.config))
    return None


if __name__ == "__main__":
    sys.exit(main())
