"""An attachment: one (network, container id, ifname), the unit of every CNI verb.

Its node-side veth is named after it, so DEL and GC find the veth without the
pod's namespace, and the veth's alias records which attachment it serves.
"""

from __future__ import annotations

from typing import NamedTuple

# CPython's own SHA-256: hashlib loads OpenSSL first, which costs a one-call
# plugin process more than the rest of the module.
try:
    from _sha256 import sha256  # Python 3.11
except ImportError:  # pragma: no cover - later Pythons moved it
    try:
        from _sha2 import sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]

NODE_VETH_PREFIX = "sl"
ALIAS_PREFIX = "sluice/"


def node_veth_name(network: str, container_id: str, ifname: str) -> str:
    digest = sha256(f"{network}/{container_id}/{ifname}".encode()).hexdigest()
    return NODE_VETH_PREFIX + digest[:12]


def alias_of(network: str, container_id: str, ifname: str) -> str:
    return f"{ALIAS_PREFIX}{network}/{container_id}/{ifname}"


def parse_alias(alias: str | None) -> tuple[str, str, str] | None:
    """(network, container id, ifname) from a node-side veth's alias, or None."""
    if not alias or not alias.startswith(ALIAS_PREFIX):
        return None
    parts = alias[len(ALIAS_PREFIX) :].split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


class Attachment(NamedTuple):
    network: str
    container_id: str
    ifname: str
    netns: str = ""  # empty for DEL and GC, which never enter it
    pod_namespace: str = ""  # from CNI_ARGS K8S_POD_NAMESPACE / K8S_POD_NAME
    pod_name: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.container_id, self.ifname

    @property
    def node_veth(self) -> str:
        return node_veth_name(self.network, self.container_id, self.ifname)

    @property
    def alias(self) -> str:
        return alias_of(self.network, self.container_id, self.ifname)
