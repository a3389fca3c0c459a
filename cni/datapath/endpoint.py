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

Every function works on an open ``Datapath`` (cni.datapath.maps), the one
handle its process holds for that bpfDir. Every writer of the pinned state
holds its state lock (``datapath.lock``; a new tcx link is created before it
is taken and pinned under it). Removal goes veth
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
from cni.datapath.maps import Datapath, DatapathMissing
from cni.datapath.structs import Endpoint, ip_be, ip_str
from cni.net import sysctl
from cni.net.netlink import NetlinkError, Rtnl, kernel_op
from cni.spec.errors import ERR_CHECK_FAILED, ERR_KERNEL, CNIError

# program -> (tcx attach type, clsact parent)
HOOKS = {"from_pod": (bpf.TCX_INGRESS, "ffff:fff2"), "to_pod": (bpf.TCX_EGRESS, "ffff:fff3")}
UPLINK_HOOKS = {
    "uplink": (bpf.TCX_EGRESS, "ffff:fff3"),
    "from_network": (bpf.TCX_INGRESS, "ffff:fff2"),
}
FILTER_HANDLE = 1
FILTER_PRIO = 1
LINKS = "links"
ARPHRD_ETHER = 1


def link_path(bpf_dir: str, ifindex: int, program: str) -> str:
    return os.path.join(bpf_dir, LINKS, f"{ifindex}_{program}")


def _program_fd(datapath: Datapath, program: str) -> int:
    return bpf.obj_get(datapath.path(program))


def _attach_links(ifindex: int, datapath: Datapath, hooks: dict[str, tuple[int, str]]) -> bool:
    """Pinned tcx links for the programs; False when the kernel has no tcx.

    Each link_create makes the kernel wait for an RCU grace period, so the links
    are created outside the state lock and pinned under it. A reload that pinned
    new programs in between has switched every pinned link but these: they are
    switched here, under the lock, before they are pinned."""
    os.makedirs(datapath.path(LINKS), exist_ok=True)
    hooks = {p: hook for p, hook in hooks.items() if not _adopt_link(ifindex, datapath, p, hook)}
    if not hooks:
        return True
    made = _create_links(ifindex, datapath, hooks)
    if made is None:
        return False
    try:
        with datapath.lock:
            for program, link_fd, prog_fd in made:
                pinned = _program_fd(datapath, program)
                try:
                    if bpf.prog_info(pinned).id != bpf.prog_info(prog_fd).id:
                        bpf.link_update(link_fd, pinned)
                finally:
                    os.close(pinned)
                path = link_path(datapath.bpf_dir, ifindex, program)
                if os.path.exists(path):  # a leftover of an earlier device with this ifindex
                    os.unlink(path)
                bpf.obj_pin(link_fd, path)
    finally:
        for _, link_fd, prog_fd in made:
            os.close(link_fd)
            os.close(prog_fd)
    return True


def _adopt_link(ifindex: int, datapath: Datapath, program: str, hook: tuple[int, str]) -> bool:
    """True when the device already has the program's pinned link, an earlier
    process's (an uplink's or the tunnel's, which outlive an agent's restart); it is
    pointed at the program pinned now. The kernel refuses a second link of one
    program on one hook (EEXIST)."""
    path = link_path(datapath.bpf_dir, ifindex, program)
    if not os.path.exists(path):
        return False
    with datapath.lock:
        try:
            link_fd = bpf.obj_get(path)
        except bpf.BPFError:
            return False  # unpinned meanwhile
        try:
            info = bpf.link_info(link_fd)
            if info.ifindex != ifindex or info.attach_type != hook[0]:
                return False  # detached: its device is gone, the ifindex reused
            prog_fd = _program_fd(datapath, program)
            try:
                if bpf.prog_info(prog_fd).id != info.prog_id:
                    bpf.link_update(link_fd, prog_fd)
            finally:
                os.close(prog_fd)
        finally:
            os.close(link_fd)
    return True


Made = tuple[str, int, int]  # (program, link fd, program fd)


def _create_links(
    ifindex: int, datapath: Datapath, hooks: dict[str, tuple[int, str]]
) -> list[Made] | None:
    """One tcx link per program; None when the kernel has no tcx."""
    made: list[Made] = []
    try:
        for index, (program, (attach_type, _)) in enumerate(hooks.items()):
            prog_fd = _program_fd(datapath, program)
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
    ipr: Rtnl, ifindex: int, datapath: Datapath, hooks: dict[str, tuple[int, str]], replace: bool
) -> None:
    for program, (_, parent) in hooks.items():
        fd = _program_fd(datapath, program)
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
        path = sysctl.path(f"net.ipv6.conf.{name}.{key}")
        with contextlib.suppress(FileNotFoundError), open(path, "w") as f:
            f.write(value)


def register(
    datapath: Datapath, ifindex: int, name: str, pod_ips: list[str], flags: int = 0
) -> None:
    """The endpoint's entries and an empty conntrack table of its own; its programs are
    attached apart (``attach_new``), before the veth is up.

    ``pod_ips`` are all of the pod's IPv4 addresses: any other source from the
    pod is spoofed."""
    if not pod_ips:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": no pod address')
    try:
        entries = datapath.conntrack.capacity()
        with datapath.lock:
            free = ctpool.take(datapath, entries)
            own_table = free is None
            slot = datapath.conntrack.allocate_slots(1)[0] if free is None else free
            if datapath.endpoints.get(ifindex) is not None:
                datapath.endpoints.delete(ifindex)  # of an earlier device with this ifindex
            datapath.endpoints.put(
                ifindex, Endpoint(ip=ip_be(pod_ips[0]), flags=flags, ct_slot=slot)
            )
            datapath.endpoints.add_ips(ifindex, pod_ips)
            datapath.endpoints.reset_stats(ifindex)
        if own_table:
            # No free table: insert one, outside the lock (a grace period, which
            # concurrent ADDs wait for at the same time). The entry names the slot
            # already, so no reaper takes the table for garbage.
            datapath.conntrack.insert_tables([slot], entries)
        reaper.table_taken(datapath)
    except (bpf.BPFError, DatapathMissing) as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_new(
    datapath: Datapath, ipr: Rtnl | None, ifindex: int, name: str, tcx: bool = True
) -> None:
    """The endpoint programs on a new veth (``ipr``: a node socket for clsact filters,
    None to open one), errors as CNI errors. ``tcx`` False: clsact filters even where
    the kernel has tcx (the datapath's "attach": "tc")."""
    try:
        attach_programs(datapath, ipr, ifindex, name, tcx=tcx)
    except bpf.BPFError as err:
        raise CNIError(ERR_KERNEL, f'failed to attach the datapath to "{name}": {err}') from None


def attach_programs(
    datapath: Datapath,
    ipr: Rtnl | None,
    ifindex: int,
    name: str,
    hooks: dict[str, tuple[int, str]] = HOOKS,
    *,
    tcx: bool = True,
) -> None:
    """The pinned programs on the device's hooks: tcx links (where the kernel has them
    and ``tcx``), else clsact filters (with ``ipr``, or a node socket of its own when
    it is None)."""
    if tcx and _attach_links(ifindex, datapath, hooks):
        return
    with contextlib.ExitStack() as stack:
        if ipr is None:
            ipr = stack.enter_context(Rtnl())
        with datapath.lock:
            with kernel_op(f'add clsact to "{name}"'):
                try:
                    ipr.add_clsact(ifindex)
                except NetlinkError as err:
                    if err.code != errno.EEXIST:
                        raise
            with kernel_op(f'attach the datapath to "{name}"'):
                _filters(ipr, ifindex, datapath, hooks, replace=False)


def detach_programs(datapath: Datapath, ipr: Rtnl, ifindex: int) -> None:
    """Take the programs off the veth, keeping its endpoint entry."""
    with datapath.lock:
        _unpin_links(datapath, ifindex, HOOKS)
    with contextlib.suppress(NetlinkError):
        ipr.delete_clsact(ifindex)


def _unpin_links(datapath: Datapath, ifindex: int, hooks: dict[str, tuple[int, str]]) -> None:
    for program in hooks:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link_path(datapath.bpf_dir, ifindex, program))


def detach(datapath: Datapath, ifindex: int, ips: list[str] | None = None) -> None:
    """Forget the endpoint and release its links (``ips``: its addresses, if the
    caller knows them: see ``Datapath.delete_endpoint``). The caller deletes the veth
    first, so the pair is gone before its filter is. No map of maps is written: what
    the endpoint used is left to the reaper."""
    try:
        with datapath.lock:
            _unpin_links(datapath, ifindex, HOOKS)
            datapath.endpoints.delete(ifindex, ips)
        reaper.after_release(datapath)
    except DatapathMissing:
        with datapath.lock:
            _unpin_links(datapath, ifindex, HOOKS)  # nothing was ever loaded here


def forget(datapath: Datapath, ifindex: int, ips: list[str] | None = None) -> None:
    """Forget the endpoint but keep its links (``release_links`` after the veth is
    deleted): with no entry its programs drop every packet, so the caller must have
    cut the pair off (taken it down) or deleted it first. ``ips`` as for ``detach``."""
    try:
        datapath.endpoints.delete(ifindex, ips)
        reaper.after_release(datapath)
    except DatapathMissing:
        pass


def forget_gone(datapath: Datapath, ips: list[str]) -> None:
    """Detach the endpoints registered for ``ips`` whose veth is gone (a DEL that
    finds no veth: its ifindex is known only to the maps)."""
    owners: set[int] = set()
    try:
        for ip in ips:
            owner = datapath.endpoints.owner_of(ip)
            if owner is not None:
                owners.add(owner)
    except DatapathMissing:
        return
    for ifindex in sorted(owners):
        if not is_live(ifindex):
            detach(datapath, ifindex, ips)


def release_links(datapath: Datapath, ifindex: int) -> None:
    """Unpin the links of a veth that is gone (a live one would make the kernel wait
    for a grace period, holding the RTNL lock, to take each program off)."""
    with datapath.lock:
        _unpin_links(datapath, ifindex, HOOKS)


# -- uplinks ----------------------------------------------------------------------------


def attach_uplink(datapath: Datapath, ipr: Rtnl, name: str) -> int:
    """Judge service flows leaving the node through ``name`` (an Ethernet device), and
    what it receives from the node network (pod sources, the tunnel); return its
    ifindex. Idempotent."""
    # Asked over rtnetlink, not sysfs: a process that entered a network namespace
    # without remounting /sys still sees the host's /sys/class/net.
    try:
        found = ipr.get_link(name)
    except NetlinkError as err:
        raise CNIError(ERR_KERNEL, f'no uplink "{name}": {err}') from None
    ifindex = found["index"]
    if found["ifi_type"] != ARPHRD_ETHER:
        raise CNIError(ERR_KERNEL, f'uplink "{name}" is not an Ethernet device')
    try:
        with datapath.lock:
            attach_programs(datapath, ipr, ifindex, name, UPLINK_HOOKS)
    except bpf.BPFError as err:
        message = f'failed to attach the uplink program to "{name}": {err}'
        raise CNIError(ERR_KERNEL, message) from None
    return ifindex


def detach_uplink(datapath: Datapath, ipr: Rtnl, name: str) -> None:
    ifindex = socket.if_nametoindex(name)
    with datapath.lock:
        if os.path.exists(link_path(datapath.bpf_dir, ifindex, "uplink")):
            _unpin_links(datapath, ifindex, UPLINK_HOOKS)
            return
    for _, parent in UPLINK_HOOKS.values():
        with contextlib.suppress(NetlinkError):
            ipr.delete_bpf_filter(ifindex, _parent(parent), FILTER_HANDLE, FILTER_PRIO)


def uplinks(datapath: Datapath) -> list[int]:
    """ifindexes with a pinned uplink link."""
    links_dir = datapath.path(LINKS)
    if not os.path.isdir(links_dir):
        return []
    return sorted(int(p.split("_", 1)[0]) for p in os.listdir(links_dir) if p.endswith("_uplink"))


# -- reload ---------------------------------------------------------------------------------


def switch_programs(datapath: Datapath, ifindexes: list[int]) -> None:
    """Point every endpoint (and uplink) at the programs pinned now (after a reload)."""
    with datapath.lock, Rtnl() as ipr:
        for ifindex in ifindexes:
            if os.path.exists(link_path(datapath.bpf_dir, ifindex, "from_pod")):
                try:
                    _update_links(datapath, ifindex, HOOKS)
                except bpf.BPFError as err:
                    if err.errno != errno.ENOLINK:
                        raise
                    detach(datapath, ifindex)  # the veth is gone: nothing to switch
                continue
            try:
                _filters(ipr, ifindex, datapath, HOOKS, replace=True)
            except NetlinkError as err:
                if err.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                    raise
        for ifindex in uplinks(datapath):
            try:
                _update_links(datapath, ifindex, UPLINK_HOOKS)
            except bpf.BPFError as err:
                if err.errno != errno.ENOLINK:
                    raise
                _unpin_links(datapath, ifindex, UPLINK_HOOKS)


def _update_links(datapath: Datapath, ifindex: int, hooks: dict[str, tuple[int, str]]) -> None:
    for program in hooks:
        path = link_path(datapath.bpf_dir, ifindex, program)
        if program in UPLINK_HOOKS and not os.path.exists(path):
            continue  # an uplink of an earlier build: the agent attaches what it lacks
        link_fd = bpf.obj_get(path)
        prog_fd = _program_fd(datapath, program)
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


def pinned_programs(datapath: Datapath) -> dict[str, int]:
    """{program: id} of the endpoint programs pinned now."""
    ids = {}
    for program in HOOKS:
        fd = _program_fd(datapath, program)
        try:
            ids[program] = bpf.prog_info(fd).id
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


def sweep(datapath: Datapath, live: set[int] | None = None) -> int:
    """Remove endpoints whose veth is gone and everything keyed by them; return how many.

    Under the state lock, each candidate is checked again just before it goes
    (``live`` is only a hint), so an endpoint or link a concurrent ADD has just
    created is never removed. Like DEL it writes no map of maps: the tables and
    policy ids the removed endpoints used are left to the reaper."""
    with datapath.lock:
        links_dir = datapath.path(LINKS)
        if os.path.isdir(links_dir):
            for pin in os.listdir(links_dir):
                ifindex = int(pin.split("_", 1)[0])
                if (live is None or ifindex not in live) and not is_live(ifindex):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(links_dir, pin))
        try:
            known = datapath.endpoints.all()
            gone = [i for i in known if (live is None or i not in live) and not is_live(i)]
            for ifindex in gone:
                datapath.endpoints.delete(ifindex)
                del known[ifindex]
            for ip, ifindex in datapath.endpoints.ips().items():
                if ifindex not in known:
                    bpf.map_delete(datapath.fd("ep_by_ip"), ctypes.c_uint32(ip_be(ip)))
            for key in list(datapath.keys("ep_stats", ctypes.c_uint32)):
                if key.value not in known:
                    bpf.map_delete(datapath.fd("ep_stats"), key)
            return len(gone)
        except DatapathMissing:
            return 0
