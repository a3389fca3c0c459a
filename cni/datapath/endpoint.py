"""One pod's datapath: its endpoint entries and the programs on its node-side veth.

ADD registers the endpoint (``register``: its addresses, an empty conntrack
table of its own, taken from the pool: ``cni.datapath.ctpool``) and attaches
the pinned programs (``attach_new``: tcx ingress of the node-side veth:
traffic from the pod; tcx egress: traffic to the pod) by the pinned
programs' fds, both before the pod's interface is up (the caller may run
them at once, the pair being down). No bcc, no compile, and with a stocked pool no write
of a map of maps (each would cost an RCU grace period).

Attachment uses tcx links (kernel 6.6+): no qdisc, so other tc users such
as the bandwidth plugin's ingress qdisc keep working, and the programs
return "next" on allow so that they run too. Each link is pinned under
``<bpfDir>/links/<ifindex>_<program>`` (a link lives as long as its pin); a
reload swaps the program inside every link in one step. Kernels without tcx
get a clsact qdisc with direct-action filters instead.

Every writer of the pinned state holds ``state_lock(bpfDir)`` (a new tcx
link is created before it is taken and pinned under it). Removal goes veth
first (the caller deletes it, or takes it down: ``forget``, then
``release_links`` once it is deleted), then links and entries, so a pair is
never up, routed and unfiltered. Removal writes plain maps only: the table
and policy maps the endpoint used are garbage that the reaper
(``cni.datapath.reaper``) deletes or refills later.
"""

from __future__ import annotations

# _socket, not socket: the module's enums and selectors cost a one-call process.
import _socket as socket
import contextlib
import ctypes
import errno
import os

from cni.datapath import bpf, ctpool, reaper
from cni.datapath.lock import state_lock
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import Endpoint, ip_be, ip_str
from cni.net.netlink import NetlinkError, Rtnl, kernel_op
from cni.spec.errors import ERR_CHECK_FAILED, ERR_KERNEL, CNIError

# program -> (tcx attach type, clsact parent)
HOOKS = {"from_pod": (bpf.TCX_INGRESS, "ffff:fff2"), "to_pod": (bpf.TCX_EGRESS, "ffff:fff3")}
UPLINK_HOOKS = {"uplink": (bpf.TCX_EGRESS, "ffff:fff3")}
FILTER_HANDLE = 1
FILTER_PRIO = 1
LINKS = "links"
ARPHRD_ETHER = 1


def link_path(bpf_dir: str, ifindex: int, program: str) -> str:
    return os.path.join(bpf_dir, LINKS, f"{ifindex}_{program}")


def _program_fd(bpf_dir: str, program: str) -> int:
    return bpf.obj_get(os.path.join(bpf_dir, program))


def _attach_links(ifindex: int, bpf_dir: str, hooks: dict[str, tuple[int, str]]) -> bool:
    """Pinned tcx links for the programs; False when the kernel has no tcx.

    Each link_create makes the kernel wait for an RCU grace period, so the links
    are created outside the state lock and pinned under it. A reload that pinned
    new programs in between has switched every pinned link but these: they are
    switched here, under the lock, before they are pinned."""
    os.makedirs(os.path.join(bpf_dir, LINKS), exist_ok=True)
    made = _create_links(ifindex, bpf_dir, hooks)
    if made is None:
        return False
    try:
        with state_lock(bpf_dir):
            for program, link_fd, prog_fd in made:
                pinned = _program_fd(bpf_dir, program)
                try:
                    if bpf.prog_info(pinned).id != bpf.prog_info(prog_fd).id:
                        bpf.link_update(link_fd, pinned)
                finally:
                    os.close(pinned)
                path = link_path(bpf_dir, ifindex, program)
                if os.path.exists(path):  # a leftover of an earlier device with this ifindex
                    os.unlink(path)
                bpf.obj_pin(link_fd, path)
    finally:
        for _, link_fd, prog_fd in made:
            os.close(link_fd)
            os.close(prog_fd)
    return True


Made = tuple[str, int, int]  # (program, link fd, program fd)


def _create_links(
    ifindex: int, bpf_dir: str, hooks: dict[str, tuple[int, str]]
) -> list[Made] | None:
    """One tcx link per program; None when the kernel has no tcx."""
    made: list[Made] = []
    try:
        for index, (program, (attach_type, _)) in enumerate(hooks.items()):
            prog_fd = _program_fd(bpf_dir, program)
            try:
                link_fd = bpf.link_create(prog_fd, ifindex, attach_type)
            except bpf.BPFError as err:
                os.close(prog_fd)
                if err.errno in (errno.EINVAL, errno.EOPNOTSUPP) and index == 0:
                    return None
                raise
            made.append((program, link_fd, prog_fd))
    except BaseException:
        for _, link_fd, prog_fd in made:
            os.close(link_fd)
            os.close(prog_fd)
        raise
    return made


def _parent(hook: str) -> int:
    """A clsact hook's parent handle as a number ("ffff:fff2" -> 0xFFFFFFF2)."""
    return int(hook.replace(":", ""), 16)


def _filters(
    ipr: Rtnl, ifindex: int, bpf_dir: str, hooks: dict[str, tuple[int, str]], replace: bool
) -> None:
    for program, (_, parent) in hooks.items():
        fd = _program_fd(bpf_dir, program)
        try:
            ipr.set_bpf_filter(
                ifindex,
                _parent(parent),
                FILTER_HANDLE,
                FILTER_PRIO,
                fd,
                f"sluice_{program}",
                replace=replace,
            )
        finally:
            os.close(fd)


def no_ipv6_from_pod(name: str) -> None:
    """The node-side veth takes no IPv6 (so no router advertisement) from the pod;
    set before the link is up."""
    for key, value in (("accept_ra", "0"), ("disable_ipv6", "1")):
        path = f"/proc/sys/net/ipv6/conf/{name}/{key}"
        with contextlib.suppress(FileNotFoundError), open(path, "w") as f:
            f.write(value)


def register(ifindex: int, name: str, pod_ips: list[str], bpf_dir: str, flags: int = 0) -> None:
    """The endpoint's entries and an empty conntrack table of its own; its programs are
    attached apart (``attach_new``), before the veth is up.

    ``pod_ips`` are all of the pod's IPv4 addresses: any other source from the
    pod is spoofed."""
    if not pod_ips:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": no pod address')
    try:
        with Datapath(bpf_dir) as datapath:
            entries = datapath.ct_capacity()
            with state_lock(bpf_dir):
                slot = ctpool.take(datapath, entries)
                own_table = slot is None
                if own_table:
                    slot = datapath.allocate_ct_slots(1)[0]
                if datapath.endpoint(ifindex) is not None:
                    datapath.delete_endpoint(ifindex)  # of an earlier device with this ifindex
                datapath.set_endpoint(
                    ifindex, Endpoint(ip=ip_be(pod_ips[0]), flags=flags, ct_slot=slot)
                )
                datapath.set_endpoint_ips(ifindex, pod_ips)
                datapath.reset_stats(ifindex)
            if own_table:
                # No free table: insert one, outside the lock (a grace period, which
                # concurrent ADDs wait for at the same time). The entry names the slot
                # already, so no reaper takes the table for garbage.
                datapath.insert_tables([slot], entries)
            reaper.table_taken(bpf_dir)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_new(ipr: Rtnl | None, ifindex: int, name: str, bpf_dir: str, tcx: bool = True) -> None:
    """The endpoint programs on a new veth (``ipr``: a node socket for clsact filters,
    None to open one), errors as CNI errors. ``tcx`` False: clsact filters even where
    the kernel has tcx (the datapath's "attach": "tc")."""
    try:
        attach_programs(ipr, ifindex, name, bpf_dir, tcx=tcx)
    except bpf.BPFError as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_programs(
    ipr: Rtnl | None,
    ifindex: int,
    name: str,
    bpf_dir: str,
    hooks: dict[str, tuple[int, str]] = HOOKS,
    *,
    tcx: bool = True,
) -> None:
    """The pinned programs on the device's hooks: tcx links (where the kernel has them
    and ``tcx``), else clsact filters (with ``ipr``, or a node socket of its own when
    it is None)."""
    if tcx and _attach_links(ifindex, bpf_dir, hooks):
        return
    with contextlib.ExitStack() as stack:
        if ipr is None:
            ipr = stack.enter_context(Rtnl())
        with state_lock(bpf_dir):
            with kernel_op(f'add clsact to "{name}"'):
                try:
                    ipr.add_clsact(ifindex)
                except NetlinkError as err:
                    if err.code != errno.EEXIST:
                        raise
            with kernel_op(f'attach the datapath to "{name}"'):
                _filters(ipr, ifindex, bpf_dir, hooks, replace=False)


def detach_programs(ipr: Rtnl, ifindex: int, bpf_dir: str) -> None:
    """Take the programs off the veth, keeping its endpoint entry."""
    with state_lock(bpf_dir):
        _unpin_links(bpf_dir, ifindex, HOOKS)
    with contextlib.suppress(NetlinkError):
        ipr.delete_clsact(ifindex)


def _unpin_links(bpf_dir: str, ifindex: int, hooks: dict[str, tuple[int, str]]) -> None:
    for program in hooks:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link_path(bpf_dir, ifindex, program))


def detach(ifindex: int, bpf_dir: str) -> None:
    """Forget the endpoint and release its links. The caller deletes the veth first,
    so the pair is gone before its filter is. No map of maps is written: what the
    endpoint used is left to the reaper."""
    try:
        with Datapath(bpf_dir) as datapath:
            with state_lock(bpf_dir):
                _unpin_links(bpf_dir, ifindex, HOOKS)
                datapath.delete_endpoint(ifindex)
            reaper.after_release(datapath)
    except DatapathMissing:
        with state_lock(bpf_dir):
            _unpin_links(bpf_dir, ifindex, HOOKS)  # nothing was ever loaded here


def forget(ifindex: int, bpf_dir: str) -> None:
    """Forget the endpoint but keep its links (``release_links`` after the veth is
    deleted): with no entry its programs drop every packet, so the caller must have
    cut the pair off (taken it down) or deleted it first."""
    try:
        with Datapath(bpf_dir) as datapath:
            datapath.delete_endpoint(ifindex)
            reaper.after_release(datapath)
    except DatapathMissing:
        pass


def release_links(ifindex: int, bpf_dir: str) -> None:
    """Unpin the links of a veth that is gone (a live one would make the kernel wait
    for a grace period, holding the RTNL lock, to take each program off)."""
    with state_lock(bpf_dir):
        _unpin_links(bpf_dir, ifindex, HOOKS)


# -- uplinks ----------------------------------------------------------------------------


def attach_uplink(ipr: Rtnl, name: str, bpf_dir: str) -> int:
    """Judge service flows leaving the node through ``name`` (an Ethernet device);
    return its ifindex. Idempotent."""
    ifindex = socket.if_nametoindex(name)
    with open(f"/sys/class/net/{name}/type") as f:
        if int(f.read()) != ARPHRD_ETHER:
            raise CNIError(ERR_KERNEL, f'uplink "{name}" is not an Ethernet device')
    try:
        with state_lock(bpf_dir):
            attach_programs(ipr, ifindex, name, bpf_dir, UPLINK_HOOKS)
    except bpf.BPFError as err:
        message = f'failed to attach the uplink program to "{name}": {err}'
        raise CNIError(ERR_KERNEL, message) from None
    return ifindex


def detach_uplink(ipr: Rtnl, name: str, bpf_dir: str) -> None:
    ifindex = socket.if_nametoindex(name)
    with state_lock(bpf_dir):
        if os.path.exists(link_path(bpf_dir, ifindex, "uplink")):
            _unpin_links(bpf_dir, ifindex, UPLINK_HOOKS)
            return
    with contextlib.suppress(NetlinkError):
        ipr.delete_bpf_filter(
            ifindex, _parent(UPLINK_HOOKS["uplink"][1]), FILTER_HANDLE, FILTER_PRIO
        )


def uplinks(bpf_dir: str) -> list[int]:
    """ifindexes with a pinned uplink link."""
    links_dir = os.path.join(bpf_dir, LINKS)
    if not os.path.isdir(links_dir):
        return []
    return sorted(int(p.split("_", 1)[0]) for p in os.listdir(links_dir) if p.endswith("_uplink"))


# -- reload ---------------------------------------------------------------------------------


def switch_programs(bpf_dir: str, ifindexes: list[int]) -> None:
    """Point every endpoint (and uplink) at the programs pinned now (after a reload)."""
    with state_lock(bpf_dir), Rtnl() as ipr:
        for ifindex in ifindexes:
            if os.path.exists(link_path(bpf_dir, ifindex, "from_pod")):
                try:
                    _update_links(bpf_dir, ifindex, HOOKS)
                except bpf.BPFError as err:
                    if err.errno != errno.ENOLINK:
                        raise
                    detach(ifindex, bpf_dir)  # the veth is gone: nothing to switch
                continue
            try:
                _filters(ipr, ifindex, bpf_dir, HOOKS, replace=True)
            except NetlinkError as err:
                if err.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                    raise
        for ifindex in uplinks(bpf_dir):
            try:
                _update_links(bpf_dir, ifindex, UPLINK_HOOKS)
            except bpf.BPFError as err:
                if err.errno != errno.ENOLINK:
                    raise
                _unpin_links(bpf_dir, ifindex, UPLINK_HOOKS)


def _update_links(bpf_dir: str, ifindex: int, hooks: dict[str, tuple[int, str]]) -> None:
    for program in hooks:
        link_fd = bpf.obj_get(link_path(bpf_dir, ifindex, program))
        prog_fd = _program_fd(bpf_dir, program)
        try:
            bpf.link_update(link_fd, prog_fd)
        finally:
            os.close(prog_fd)
            os.close(link_fd)


def live_ifindexes() -> set[int]:
    return {index for index, _ in socket.if_nameindex()}


def is_live(ifindex: int) -> bool:
    try:
        socket.if_indextoname(ifindex)
    except OSError:
        return False
    return True


def pinned_programs(bpf_dir: str) -> dict[str, int]:
    """{program: id} of the endpoint programs pinned now."""
    ids = {}
    for program in HOOKS:
        fd = _program_fd(bpf_dir, program)
        try:
            ids[program] = bpf.prog_info(fd).id
        finally:
            os.close(fd)
    return ids


def attached_programs(ipr: Rtnl, ifindex: int, bpf_dir: str) -> dict[str, int | None]:
    """{program: id} of what runs on the veth: the link's program, or the clsact
    filter's (None if the kernel did not say which)."""
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
            filters = ipr.bpf_filters(ifindex, _parent(parent))
        except NetlinkError:
            continue
        for msg in filters:
            options = msg.get("TCA_OPTIONS")
            if options and options.get("TCA_BPF_NAME") == f"sluice_{program}":
                found[program] = options.get("TCA_BPF_ID")
    return found


def check(ipr: Rtnl, ifindex: int, name: str, pod_ips: list[str], bpf_dir: str) -> None:
    """CHECK: the veth runs the pinned programs, its endpoint entry is right and every
    pod address is registered as its own."""
    try:
        pinned = pinned_programs(bpf_dir)
        with Datapath(bpf_dir) as datapath:
            endpoint = datapath.endpoint(ifindex)
            registered = datapath.endpoint_ips(ifindex)
            tables = datapath.ct_tables()
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
    if pod_ips and ip_str(endpoint.ip) not in pod_ips:
        raise CNIError(ERR_CHECK_FAILED, f'the endpoint entry of "{name}" is not for {pod_ips[0]}')
    missing = [ip for ip in pod_ips if registered.get(ip) != ifindex]
    if missing:
        raise CNIError(
            ERR_CHECK_FAILED, f'the datapath does not know {missing} as addresses of "{name}"'
        )
    if ifindex not in tables:
        raise CNIError(ERR_CHECK_FAILED, f'"{name}" (ifindex {ifindex}) has no conntrack table')


def sweep(bpf_dir: str, live: set[int] | None = None) -> int:
    """Remove endpoints whose veth is gone and everything keyed by them; return how many.

    Under the state lock, each candidate is checked again just before it goes
    (``live`` is only a hint), so an endpoint or link a concurrent ADD has just
    created is never removed. Like DEL it writes no map of maps: the tables and
    policy ids the removed endpoints used are left to the reaper."""
    with state_lock(bpf_dir):
        links_dir = os.path.join(bpf_dir, LINKS)
        if os.path.isdir(links_dir):
            for pin in os.listdir(links_dir):
                ifindex = int(pin.split("_", 1)[0])
                if (live is None or ifindex not in live) and not is_live(ifindex):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(links_dir, pin))
        try:
            with Datapath(bpf_dir) as datapath:
                known = datapath.endpoints()
                gone = [i for i in known if (live is None or i not in live) and not is_live(i)]
                for ifindex in gone:
                    datapath.delete_endpoint(ifindex)
                    del known[ifindex]
                for ip, ifindex in datapath.endpoint_ips().items():
                    if ifindex not in known:
                        bpf.map_delete(datapath.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
                for key in list(datapath.keys("ep_stats", ctypes.c_uint32)):
                    if key.value not in known:
                        bpf.map_delete(datapath.fd("ep_stats"), key)
                return len(gone)
        except DatapathMissing:
            return 0
