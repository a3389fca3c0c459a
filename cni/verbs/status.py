"""STATUS: exit 0 when an ADD could be served now, code 50 when it could not.

Cheap and without side effects beyond opening the IPAM store: the kubelet
asks every few seconds.
"""

from __future__ import annotations

from cni import ipam_client, masq
from cni.errors import ERR_NOT_AVAILABLE, CNIError
from cni.protocol import Request
from cni.verbs import AGENT_REQUIRED, load_conf


def run(request: Request) -> None:
    conf = load_conf(request)
    if conf.policy == "enforce":
        raise CNIError(ERR_NOT_AVAILABLE, AGENT_REQUIRED)
    if conf.ip_masq and masq.nft_binary() is None:
        raise CNIError(ERR_NOT_AVAILABLE, '"ipMasq" is on but the nft command is not installed')
    ipam_client.for_request(request).status()
