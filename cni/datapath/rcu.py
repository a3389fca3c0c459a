"""RCU grace periods: the price of writing a map of maps, and how to wait for one.

After every insert, replace or delete of an element of a map of maps
(``peers``, ``rules``, ``ct_tables``) the kernel waits for an RCU grace
period, so that no program still uses the old inner map when the system
call returns: 2 to 4 jiffies (8 to 16 ms at HZ=250), however idle the
machine. A batched update pays one wait for the whole batch; deleting an
absent key pays none. So the CNI path never writes a map of maps when it
can avoid it, and this module counts, per thread, the waits that were paid
(the agent reports them; tests check that ADD and DEL pay none).

``wait_for_readers()`` waits for a grace period on its own: once it returns,
every program that was running when it was called has finished, so nothing
found unreferenced before the call is still in use by a packet.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import Counter

SYS_MEMBARRIER = {"x86_64": 324, "aarch64": 283}[os.uname().machine]
MEMBARRIER_CMD_GLOBAL = 1 << 0  # synchronize_rcu() in the kernel

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_guard = threading.Lock()
_waits: Counter[str] = Counter()


def count_waits(waits: int = 1) -> None:
    """Record grace periods the calling thread just waited for."""
    if waits:
        with _guard:
            _waits[threading.current_thread().name] += waits


def waits_by_thread() -> dict[str, int]:
    """Grace periods waited for since the process started, by thread name."""
    with _guard:
        return dict(_waits)


def wait_for_readers() -> bool:
    """Wait for an RCU grace period; False if the kernel cannot (membarrier is refused
    on nohz_full kernels), and then the caller must wait another way."""
    if _libc.syscall(SYS_MEMBARRIER, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0:
        return False
    count_waits()
    return True
