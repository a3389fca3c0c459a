"""Reading a network's conflist the way libcni does, for sluicectl.

Every sluicectl command takes ``--conf FILE`` and finds the network's state
(stateDir, bpfDir, agentSocket) through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_CONF = "/etc/cni/net.d/10-sluice.conflist"


class ConflistError(Exception):
    pass


@dataclass(frozen=True)
class Conflist:
    path: str
    data: dict[str, Any]

    @property
    def network(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def cni_version(self) -> str:
        return str(self.data.get("cniVersion", ""))

    def plugin(self, plugin_type: str = "sluice") -> dict[str, Any]:
        """The plugin object as the plugin receives it: with name and cniVersion injected."""
        for plugin in self.data.get("plugins", []):
            if isinstance(plugin, dict) and plugin.get("type") == plugin_type:
                return {**plugin, "name": self.network, "cniVersion": self.cni_version}
        raise ConflistError(f'"{self.path}" has no plugin of type "{plugin_type}"')

    def ipam_plugin(self) -> dict[str, Any]:
        """The (first) plugin object whose IPAM is sluice-ipam, as that plugin receives it."""
        for plugin in self.data.get("plugins", []):
            ipam = plugin.get("ipam") if isinstance(plugin, dict) else None
            if isinstance(ipam, dict) and ipam.get("type") == "sluice-ipam":
                return {**plugin, "name": self.network, "cniVersion": self.cni_version}
        raise ConflistError(f'"{self.path}" has no plugin with "ipam.type": "sluice-ipam"')


def load(path: str) -> Conflist:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ConflistError(f'failed to read "{path}": {err.strerror}') from None
    except json.JSONDecodeError as err:
        raise ConflistError(f'"{path}" is not JSON: {err}') from None
    if not isinstance(data, dict) or not isinstance(data.get("plugins"), list):
        raise ConflistError(f'"{path}" is not a conflist (no "plugins" list)')
    return Conflist(path, data)
