"""One fsync per commit for processes that open the store for a single call.

With WAL and synchronous=FULL a commit costs one fsync of the WAL. But when
the last connection to a database closes, SQLite checkpoints the WAL into
the database (two more fsyncs) and deletes it, and the next process creates
it again (one more, for the directory): five per plugin call instead of one.
So each connection asks SQLite to keep the WAL (SQLITE_FCNTL_PERSIST_WAL) and
not to checkpoint on close (SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE); the WAL is
checkpointed as it grows, by whichever commit crosses the auto-checkpoint
size. Durability is unchanged: every commit is on disk when it returns.

Python 3.11's sqlite3 exposes neither setting, so they are set through the
library's C API on the connection's handle, found where CPython keeps it and
checked against the database's file name before use; when the check fails
nothing is changed and SQLite behaves as by default.
"""

from __future__ import annotations

import ctypes
import os
import sqlite3

SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE = 1006
SQLITE_FCNTL_PERSIST_WAL = 10
# pysqlite_Connection: PyObject_HEAD (reference count, type), then the sqlite3 handle.
HANDLE_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)
# The library the sqlite3 module is linked with, so loading it finds it in the process.
LIBRARY = "libsqlite3.so.0"

_library: ctypes.CDLL | None = None


def _sqlite() -> ctypes.CDLL | None:
    global _library
    if _library is None:
        lib = load_library(LIBRARY, "sqlite3")
        if lib is None:
            return None
        lib.sqlite3_db_filename.restype = ctypes.c_char_p
        lib.sqlite3_db_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.sqlite3_db_config.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
        ]
        lib.sqlite3_file_control.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        _library = lib
    return _library


def load_library(soname: str, name: str) -> ctypes.CDLL | None:
    """The shared library by its soname, else wherever ``ctypes.util`` finds it.

    The soname comes first: ``find_library`` runs ``ldconfig -p`` (and imports
    subprocess, tempfile and more), a cost every short-lived process would pay."""
    try:
        return ctypes.CDLL(soname)
    except OSError:
        pass
    from ctypes import util

    found = util.find_library(name)
    if found is None:
        return None
    try:
        return ctypes.CDLL(found)
    except OSError:
        return None


def keep_wal_between_processes(db: sqlite3.Connection, path: str) -> bool:
    """Apply both settings to ``db`` (opened on ``path``); False if it could not."""
    lib = _sqlite()
    if lib is None:
        return False
    handle = ctypes.c_void_p.from_address(id(db) + HANDLE_OFFSET).value
    if not handle:
        return False
    filename = lib.sqlite3_db_filename(handle, b"main")
    if not filename or os.path.realpath(filename.decode()) != os.path.realpath(path):
        return False
    applied = ctypes.c_int(0)
    lib.sqlite3_db_config(handle, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, ctypes.byref(applied))
    keep = ctypes.c_int(1)
    lib.sqlite3_file_control(handle, b"main", SQLITE_FCNTL_PERSIST_WAL, ctypes.byref(keep))
    return applied.value == 1
