"""STATUS: exit 0 when an ADD could be served now, code 50 when it could not.

Cheap and without side effects beyond opening the IPAM store: the kubelet
asks every few seconds.
"""

from __future__ import annotations

import importlib.util

from cni.datapath.maps import Datapath
from cni.net import nftables
from cni.plugin import ipam_client
from cni.plugin.netconf import NetConf
from cni.plugin.verbs import agent_required, load_conf
from cni.spec.errors import ERR_NOT_AVAILABLE, CNIError
from cni.spec.protocol import Request


def run(request: Request) -> None:
    conf = load_conf(request)
    if conf.policy == "enforce":  # in the plugin's own process: no agent answered
        raise CNIError(ERR_NOT_AVAILABLE, agent_required(conf))
    with Datapath(conf.bpf_dir) as datapath:
        status(conf, datapath=datapath)


def status(
    conf: NetConf,
    *,
    datapath: Datapath,
    allocators: ipam_client.KeptAllocators | None = None,
) -> None:
    if conf.ip_masq and not nftables.available():
        raise CNIError(
            ERR_NOT_AVAILABLE, '"ipMasq" is on but neither libnftables nor nft is installed'
        )
    if not datapath_available(datapath):
        raise CNIError(
            ERR_NOT_AVAILABLE,
            f'the datapath is not loaded in "{conf.bpf_dir}" and bcc is not installed to load it',
        )
    with ipam_client.client(conf.ipam, conf.cni_version, allocators) as ipam:
        ipam.status()


def datapath_available(datapath: Datapath) -> bool:
    return datapath.is_loaded() or importlib.util.find_spec("bcc") is not None
