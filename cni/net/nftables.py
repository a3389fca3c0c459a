"""Running nftables scripts: in-process through libnftables (the library the nft
command is built on), or by running nft where the library is missing.

A plugin call that masquerades a pod would otherwise fork and exec nft, which
costs more than the rest of its kernel work together.
"""

from __future__ import annotations

import ctypes
import threading

LIBRARY = "libnftables.so.1"


class _Library:
    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        self.lock = threading.Lock()  # one context, used by one thread at a time

    def run(self, script: str) -> tuple[int, str, str]:
        with self.lock:
            rc = self.lib.nft_run_cmd_from_buffer(self.ctx, script.encode())
            output = self.lib.nft_ctx_get_output_buffer(self.ctx) or b""
            error = self.lib.nft_ctx_get_error_buffer(self.ctx) or b""
        return (
            (0 if rc == 0 else 1),
            output.decode(errors="replace"),
            error.decode(errors="replace").strip(),
        )


_library: _Library | None = None
_looked = False


def _load() -> _Library | None:
    global _library, _looked
    if not _looked:
        _looked = True
        try:
            _library = _Library(_dlopen())
        except (OSError, AttributeError):
            _library = None
    return _library


def _dlopen() -> ctypes.CDLL:
    """By soname first: ``ctypes.util.find_library`` runs ``ldconfig -p`` (and
    imports subprocess, tempfile and more) in every process that asks."""
    try:
        return ctypes.CDLL(LIBRARY)
    except OSError:
        from ctypes import util

        return ctypes.CDLL(util.find_library("nftables") or LIBRARY)


def nft_binary() -> str | None:
    import shutil

    return shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")


def available() -> bool:
    return _load() is not None or nft_binary() is not None


def run(script: str) -> tuple[int, str]:
    """(0 or 1, the error text); FileNotFoundError when neither way exists."""
    rc, _, error = query(script)
    return rc, error


def query(script: str) -> tuple[int, str, str]:
    """(0 or 1, what nft printed, the error text); FileNotFoundError when neither way
    exists."""
    library = _load()
    if library is not None:
        return library.run(script)
    nft = nft_binary()
    if nft is None:
        raise FileNotFoundError("neither libnftables nor the nft command is installed")
    import subprocess

    proc = subprocess.run(
        [nft, "-f", "-"], input=script, capture_output=True, text=True, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr.strip()
