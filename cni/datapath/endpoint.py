"""One pod's datapath: its endpoint entry and the programs on its node-side veth.

ADD writes the endpoint entry first and then attaches the pinned programs
(clsact ingress: traffic from the pod; egress: traffic to the pod) by the
pinned programs' fds, before the pod's interface is up. No bcc, no compile.
"""

from __future__ import annotations

import errno
import os

from cni.datapath import bpf
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import Endpoint, ip_be
from cni.errors import ERR_CHECK_FAILED, ERR_KERNEL, CNIError
from cni.netlink import IPRoute, NetlinkError, kernel_op

# clsact hooks: ingress of the node-side veth sees the pod's packets.
HOOKS = {"from_pod": "ffff:fff2", "to_pod": "ffff:fff3"}
FILTER_HANDLE = 1
FILTER_PRIO = 1


def _filter(ipr: IPRoute, command: str, ifindex: int, bpf_dir: str) -> None:
    for program, parent in HOOKS.items():
        fd = bpf.obj_get(os.path.join(bpf_dir, program))
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


def attach(
    ipr: IPRoute, ifindex: int, name: str, pod_ip: str, bpf_dir: str, flags: int = 0
) -> None:
    """Endpoint entry, then the programs; fails closed (no entry: every packet drops)."""
    try:
        with Datapath(bpf_dir) as datapath:
            datapath.set_endpoint(ifindex, Endpoint(ip=ip_be(pod_ip), policy_gen=0, flags=flags))
        with kernel_op(f'add clsact to "{name}"'):
            try:
                ipr.tc("add", "clsact", ifindex)
            except NetlinkError as err:
                if err.code != errno.EEXIST:
                    raise
        with kernel_op(f'attach the datapath to "{name}"'):
            _filter(ipr, "add-filter", ifindex, bpf_dir)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def detach(ifindex: int, bpf_dir: str) -> None:
    """Forget the endpoint (the veth's filters go with the veth)."""
    try:
        with Datapath(bpf_dir) as datapath:
            datapath.delete_endpoint(ifindex)
    except DatapathMissing:
        pass  # nothing was ever loaded here


def switch_programs(bpf_dir: str, ifindexes: list[int]) -> None:
    """Point every endpoint's filters at the programs pinned now (after a reload)."""
    with IPRoute() as ipr:
        for ifindex in ifindexes:
            try:
                _filter(ipr, "replace-filter", ifindex, bpf_dir)
            except NetlinkError as err:
                if err.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                    raise


def attached_hooks(ipr: IPRoute, ifindex: int) -> set[str]:
    """Hooks of the veth that run a sluice program (pyroute2 does not decode program ids)."""
    found = set()
    for hook, parent in HOOKS.items():
        try:
            filters = ipr.get_filters(index=ifindex, parent=int(parent.replace(":", ""), 16))
        except NetlinkError:
            continue
        for msg in filters:
            options = msg.get("TCA_OPTIONS")
            if options and options.get("TCA_BPF_NAME") == f"sluice_{hook}":
                found.add(hook)
    return found


def pinned_programs(bpf_dir: str) -> dict[str, int]:
    """{program: id} of the programs pinned now."""
    ids = {}
    for program in HOOKS:
        fd = bpf.obj_get(os.path.join(bpf_dir, program))
        try:
            ids[program] = bpf.prog_info(fd).id
        finally:
            os.close(fd)
    return ids


def check(ipr: IPRoute, ifindex: int, name: str, pod_ip: str, bpf_dir: str) -> None:
    """CHECK: the veth runs the sluice programs and its endpoint entry is right."""
    try:
        with Datapath(bpf_dir) as datapath:
            endpoint = datapath.endpoint(ifindex)
    except DatapathMissing as err:
        raise CNIError(
            ERR_CHECK_FAILED, f'the datapath in "{bpf_dir}" is not loaded: {err}'
        ) from None
    missing = set(HOOKS) - attached_hooks(ipr, ifindex)
    if missing:
        raise CNIError(
            ERR_CHECK_FAILED, f'"{name}" lacks the datapath program(s) {sorted(missing)}'
        )
    if endpoint is None:
        raise CNIError(ERR_CHECK_FAILED, f'"{name}" (ifindex {ifindex}) has no endpoint entry')
    if endpoint.ip != ip_be(pod_ip):
        raise CNIError(ERR_CHECK_FAILED, f'the endpoint entry of "{name}" is not for {pod_ip}')


def sweep(bpf_dir: str, live: set[int]) -> int:
    """Remove endpoints whose veth is gone, and every entry keyed by a gone endpoint."""
    try:
        with Datapath(bpf_dir) as datapath:
            gone = set(datapath.endpoints()) - live
            for ifindex in gone:
                datapath.delete_endpoint(ifindex)
            known = set(datapath.endpoints())
            for ifindex, gen, direction in datapath.policy_keys():
                current = datapath.endpoint(ifindex) if ifindex in known else None
                if current is None or gen not in (current.policy_gen,):
                    datapath.delete_policy_maps(ifindex, gen, direction)
            stale = {k.ifindex for k, _ in datapath.flows()} - known
            datapath.sweep_flows(stale)
            return len(gone)
    except DatapathMissing:
        return 0
