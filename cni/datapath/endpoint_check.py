"""What runs on an endpoint's veth, and CHECK's verdict on an endpoint.

A veth runs the pinned programs through its pinned tcx links or, where the
kernel has no tcx (or the datapath's "attach" is "tc"), its clsact filters.
"""

from __future__ import annotations

import os

from cni.datapath import bpf, bpf_links, bpf_programs
from cni.datapath.attach import HOOKS, clsact_parent, link_path, program_fd
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import ip_str
from cni.net.netlink import NetlinkError, Rtnl
from cni.spec.errors import ERR_CHECK_FAILED, CNIError


def pinned_programs(datapath: Datapath) -> dict[str, int]:
    """{program: id} of the endpoint programs pinned now."""
    ids = {}
    for program in HOOKS:
        fd = program_fd(datapath, program)
        try:
            ids[program] = bpf_programs.prog_info(fd).id
        finally:
            os.close(fd)
    return ids


def attached_programs(datapath: Datapath, ipr: Rtnl, ifindex: int) -> dict[str, int | None]:
    """{program: id} of what runs on the veth: the link's program, or the clsact
    filter's (None if the kernel did not say which)."""
    found: dict[str, int | None] = {}
    for program, (attach_type, parent) in HOOKS.items():
        path = link_path(datapath.bpf_dir, ifindex, program)
        if os.path.exists(path):
            fd = bpf.obj_get(path)
            try:
                info = bpf_links.link_info(fd)
            finally:
                os.close(fd)
            if info.ifindex == ifindex and info.attach_type == attach_type:
                found[program] = info.prog_id
            continue
        try:
            filters = ipr.bpf_filters(ifindex, clsact_parent(parent))
        except NetlinkError:
            continue
        for msg in filters:
            options = msg.get("TCA_OPTIONS")
            if options and options.get("TCA_BPF_NAME") == f"sluice_{program}":
                found[program] = options.get("TCA_BPF_ID")
    return found


def check(datapath: Datapath, ipr: Rtnl, ifindex: int, name: str, pod_ips: list[str]) -> None:
    """CHECK: the veth runs the pinned programs, its endpoint entry is right and every
    pod address is registered as its own."""
    try:
        pinned = pinned_programs(datapath)
        endpoint = datapath.endpoints.get(ifindex)
        registered = datapath.endpoints.ips(ifindex)
        tables = datapath.conntrack.tables()
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(
            ERR_CHECK_FAILED, f'the datapath in "{datapath.bpf_dir}" is not loaded: {err}'
        ) from None
    attached = attached_programs(datapath, ipr, ifindex)
    for program, prog_id in pinned.items():
        if program not in attached:
            raise CNIError(ERR_CHECK_FAILED, f'"{name}" does not run the {program} program')
        if attached[program] not in (None, prog_id):
            raise CNIError(
                ERR_CHECK_FAILED,
                f'"{name}" runs an old {program} program '
                f"(id {attached[program]}, pinned: {prog_id})",
            )
    if endpoint is None:
        raise CNIError(ERR_CHECK_FAILED, f'"{name}" (ifindex {ifindex}) has no endpoint entry')
    if pod_ips and ip_str(endpoint.ip) not in pod_ips:
        raise CNIError(ERR_CHECK_FAILED, f'the endpoint entry of "{name}" is not for {pod_ips[0]}')
    missing = [ip for ip in pod_ips if registered.get(ip) != ifindex]
    if missing:
        raise CNIError(
            ERR_CHECK_FAILED, f'the datapath does not know {missing} as addresses of "{name}"'
        )
    if ifindex not in tables:
        raise CNIError(ERR_CHECK_FAILED, f'"{name}" (ifindex {ifindex}) has no conntrack table')
