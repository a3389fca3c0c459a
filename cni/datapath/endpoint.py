"""One pod's datapath: its endpoint entry and the programs on its node-side veth.

ADD writes the endpoint entry first and then attaches the pinned programs
(ingress of the node-side veth: traffic from the pod; egress: traffic to
the pod) by the pinned programs' fds, before the pod's interface is up. No
bcc, no compile.

Attachment uses tcx links (kernel 6.6+): no qdisc, so other tc users such
as the bandwidth plugin's ingress qdisc keep working, and the programs
return "next" on allow so that they run too. Each link is pinned under
``<bpfDir>/links/<ifindex>_<program>`` (a link lives as long as its pin); a
reload swaps the program inside every link in one step. Kernels without tcx
get a clsact qdisc with direct-action filters instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from cni.datapath import bpf
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import Endpoint, ip_be
from cni.errors import ERR_CHECK_FAILED, ERR_KERNEL, CNIError
from cni.net.netlink import NetlinkError, Rtnl, kernel_op

# program -> (tcx attach type, clsact parent)
HOOKS = {"from_pod": (bpf.TCX_INGRESS, "ffff:fff2"), "to_pod": (bpf.TCX_EGRESS, "ffff:fff3")}
FILTER_HANDLE = 1
FILTER_PRIO = 1
LINKS = "links"


def link_path(bpf_dir: str, ifindex: int, program: str) -> str:
    return os.path.join(bpf_dir, LINKS, f"{ifindex}_{program}")


def _program_fd(bpf_dir: str, program: str) -> int:
    return bpf.obj_get(os.path.join(bpf_dir, program))


def _attach_links(ifindex: int, bpf_dir: str) -> bool:
    """Pinned tcx links for both programs; False when the kernel has no tcx."""
    os.makedirs(os.path.join(bpf_dir, LINKS), exist_ok=True)
    for program, (attach_type, _) in HOOKS.items():
        path = link_path(bpf_dir, ifindex, program)
        if os.path.exists(path):  # a leftover of an earlier veth with this ifindex
            os.unlink(path)
        prog_fd = _program_fd(bpf_dir, program)
        try:
            link_fd = bpf.link_create(prog_fd, ifindex, attach_type)
        except bpf.BPFError as err:
            if err.errno in (errno.EINVAL, errno.EOPNOTSUPP) and program == "from_pod":
                return False
            raise
        finally:
            os.close(prog_fd)
        try:
            bpf.obj_pin(link_fd, path)
        finally:
            os.close(link_fd)
    return True


def _filters(ipr: Rtnl, command: str, ifindex: int, bpf_dir: str) -> None:
    for program, (_, parent) in HOOKS.items():
        fd = _program_fd(bpf_dir, program)
        try:
            ipr.tc(
                command,
                "bpf",
                ifindex,
                FILTER_HANDLE,
                fd=fd,
                name=f"sluice_{program}",
                parent=parent,
                prio=FILTER_PRIO,
                classid=1,
                direct_action=True,
            )
        finally:
            os.close(fd)


def attach(ipr: Rtnl, ifindex: int, name: str, pod_ip: str, bpf_dir: str, flags: int = 0) -> None:
    """Endpoint entry, then the programs; fails closed (no entry: every packet drops)."""
    try:
        with Datapath(bpf_dir) as datapath:
            datapath.set_endpoint(ifindex, Endpoint(ip=ip_be(pod_ip), policy_gen=0, flags=flags))
        attach_programs(ipr, ifindex, name, bpf_dir)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_programs(ipr: Rtnl, ifindex: int, name: str, bpf_dir: str) -> None:
    """The pinned programs on the veth's hooks: tcx links, or clsact filters."""
    if _attach_links(ifindex, bpf_dir):
        return
    with kernel_op(f'add clsact to "{name}"'):
        try:
            ipr.tc("add", "clsact", ifindex)
        except NetlinkError as err:
            if err.code != errno.EEXIST:
                raise
    with kernel_op(f'attach the datapath to "{name}"'):
        _filters(ipr, "add-filter", ifindex, bpf_dir)


def detach_programs(ipr: Rtnl, ifindex: int, bpf_dir: str) -> None:
    """Take the programs off the veth, keeping its endpoint entry."""
    _unpin_links(bpf_dir, ifindex)
    with contextlib.suppress(NetlinkError):
        ipr.tc("del", "clsact", ifindex)


def _unpin_links(bpf_dir: str, ifindex: int) -> None:
    for program in HOOKS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link_path(bpf_dir, ifindex, program))


def detach(ifindex: int, bpf_dir: str) -> None:
    """Forget the endpoint and release its links (clsact filters go with the veth)."""
    _unpin_links(bpf_dir, ifindex)
    try:
        with Datapath(bpf_dir) as datapath:
            datapath.delete_endpoint(ifindex)
    except DatapathMissing:
        pass  # nothing was ever loaded here


def switch_programs(bpf_dir: str, ifindexes: list[int]) -> None:
    """Point every endpoint at the programs pinned now (after a reload)."""
    with Rtnl() as ipr:
        for ifindex in ifindexes:
            if os.path.exists(link_path(bpf_dir, ifindex, "from_pod")):
                try:
                    _update_links(bpf_dir, ifindex)
                except bpf.BPFError as err:
                    if err.errno != errno.ENOLINK:
                        raise
                    detach(ifindex, bpf_dir)  # the veth is gone: nothing to switch
                continue
            try:
                _filters(ipr, "replace-filter", ifindex, bpf_dir)
            except NetlinkError as err:
                if err.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                    raise


def _update_links(bpf_dir: str, ifindex: int) -> None:
    for program in HOOKS:
        link_fd = bpf.obj_get(link_path(bpf_dir, ifindex, program))
        prog_fd = _program_fd(bpf_dir, program)
        try:
            bpf.link_update(link_fd, prog_fd)
        finally:
            os.close(prog_fd)
            os.close(link_fd)


def live_ifindexes() -> set[int]:
    return {index for index, _ in socket.if_nameindex()}


def pinned_programs(bpf_dir: str) -> dict[str, int]:
    """{program: id} of the programs pinned now."""
    ids = {}
    for program in HOOKS:
        fd = _program_fd(bpf_dir, program)
        try:
            ids[program] = bpf.prog_info(fd).id
        finally:
            os.close(fd)
    return ids


def attached_programs(ipr: Rtnl, ifindex: int, bpf_dir: str) -> dict[str, int | None]:
    """{program: id} of what runs on the veth: the link's program, or for a clsact
    filter None (pyroute2 does not decode a filter's program id)."""
    found: dict[str, int | None] = {}
    for program, (attach_type, parent) in HOOKS.items():
        path = link_path(bpf_dir, ifindex, program)
        if os.path.exists(path):
            fd = bpf.obj_get(path)
            try:
                info = bpf.link_info(fd)
            finally:
                os.close(fd)
            if info.ifindex == ifindex and info.attach_type == attach_type:
                found[program] = info.prog_id
            continue
        try:
            filters = ipr.get_filters(index=ifindex, parent=int(parent.replace(":", ""), 16))
        except NetlinkError:
            continue
        for msg in filters:
            options = msg.get("TCA_OPTIONS")
            if options and options.get("TCA_BPF_NAME") == f"sluice_{program}":
                found[program] = None
    return found


def check(ipr: Rtnl, ifindex: int, name: str, pod_ip: str, bpf_dir: str) -> None:
    """CHECK: the veth runs the pinned programs and its endpoint entry is right."""
    try:
        pinned = pinned_programs(bpf_dir)
        with Datapath(bpf_dir) as datapath:
            endpoint = datapath.endpoint(ifindex)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(
            ERR_CHECK_FAILED, f'the datapath in "{bpf_dir}" is not loaded: {err}'
        ) from None
    attached = attached_programs(ipr, ifindex, bpf_dir)
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
    if endpoint.ip != ip_be(pod_ip):
        raise CNIError(ERR_CHECK_FAILED, f'the endpoint entry of "{name}" is not for {pod_ip}')


def sweep(bpf_dir: str, live: set[int]) -> int:
    """Remove endpoints whose veth is gone, and every entry keyed by a gone endpoint."""
    links_dir = os.path.join(bpf_dir, LINKS)
    if os.path.isdir(links_dir):
        for pin in os.listdir(links_dir):
            if int(pin.split("_", 1)[0]) not in live:
                os.unlink(os.path.join(links_dir, pin))
    try:
        with Datapath(bpf_dir) as datapath:
            gone = set(datapath.endpoints()) - live
            for ifindex in gone:
                datapath.delete_endpoint(ifindex)
            known = datapath.endpoints()
            for ifindex, gen, direction in datapath.policy_keys():
                if ifindex not in known or gen != known[ifindex].policy_gen:
                    datapath.delete_policy_maps(ifindex, gen, direction)
            datapath.sweep_flows({k.ifindex for k, _ in datapath.flows()} - set(known))
            return len(gone)
    except DatapathMissing:
        return 0
