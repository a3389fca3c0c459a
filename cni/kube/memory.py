"""Process-wide memory settings for the long-running processes (the agent, the
controller).

glibc's malloc gives each thread that allocates while another holds the main
heap an arena of its own, up to eight per CPU. The informers, writers and the
enforcer each allocate and free short-lived JSON in their own thread, so every
arena ends up holding freed but unreturnable pages: measured on the scale
benchmark, that fragmentation was a large share of the resident memory. Two
arenas keep lock contention low (the threads spend most of their time waiting
on the network, and the interpreter's lock serialises the rest) and the heap
compact.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("sluice.k8s")

M_ARENA_MAX = -8  # from glibc's malloc.h
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before starting threads. False where the C
    library is not glibc (nothing to do there)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:
        log.warning("mallopt(M_ARENA_MAX, %d) failed; malloc keeps its default arenas", arenas)
        return False
    return True


def release_free_memory() -> None:
    """Give the pages malloc holds free back to the system (``malloc_trim``): once after
    a sync, whose lists and first computations leave freed memory scattered through the
    heap, below objects that stay (glibc returns only the heap's free top by itself)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc
