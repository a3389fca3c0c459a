"""The agent's unix socket: who may connect, how much they may send, one thread
per connection.

The socket is created with mode 0600 inside a root-owned directory of mode
0700, and every connection's peer credentials (SO_PEERCRED) are checked
before anything is read: only root (or the agent's own user) is served. A
request is read with a size limit and one deadline for the whole of it (a peer
trickling a byte at a time gets no more), and before it takes one of the
slots that bound how many requests run at once, so that connections that
never finish sending hold no slot a DEL needs. The answer is sent with a
deadline too. Whatever goes wrong with one connection is answered (or
dropped) without touching the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import socketserver
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any

from cni.plugin import frames

log = logging.getLogger("sluice.agent")

REQUEST_DEADLINE = 10.0  # seconds to send a whole request
ANSWER_DEADLINE = 10.0  # seconds for the peer to take the whole answer
MAX_CONCURRENT = 64  # requests served at once; more wait for a slot
MAX_READING = 512  # connections read at once (one thread each); more are dropped
UCRED = struct.Struct("3i")  # pid, uid, gid

RequestHandler = Callable[[dict[str, Any]], dict[str, Any]]
CallHandler = Callable[[dict[str, str], bytes], tuple[int, str, str]]


class ServerError(Exception):
    pass


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    pid, uid, gid = UCRED.unpack(raw)
    return pid, uid, gid


class _Connection(socketserver.BaseRequestHandler):
    server: AgentServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        pid, uid, _ = peer_credentials(sock)
        if uid not in (0, os.geteuid()):
            log.warning("refused a connection from pid %d uid %d", pid, uid)
            return
        if not self.server.reading.acquire(blocking=False):
            log.warning("dropped a connection from pid %d: %d being read", pid, MAX_READING)
            return
        try:
            try:
                body = frames.receive_frame(
                    frames.Deadline(sock, REQUEST_DEADLINE), frames.MAX_REQUEST
                )
                call = frames.parse_call(body) if frames.is_call(body) else None
                request = None if call else frames.decode(body)
            except (OSError, frames.FrameError) as err:
                log.warning("bad request from pid %d: %s", pid, err)
                refusal = {"error": f"bad request: {err}"}
                with contextlib.suppress(OSError):
                    frames.send(frames.Deadline(sock, ANSWER_DEADLINE), refusal)
                return
        finally:
            self.server.reading.release()
        with self.server.slots:
            if _caller_gone(sock):  # it gave up waiting (its deadline): run nothing for it
                log.warning("pid %d gave up before its request ran: not running it", pid)
                return
            if call is not None:
                answer = self._run_call(pid, *call)
            else:
                assert request is not None
                answer = self._run_request(pid, request)
        try:
            frames.send_frame(frames.Deadline(sock, ANSWER_DEADLINE), answer)
        except OSError as err:
            log.warning("the answer to pid %d was not taken: %s", pid, err)

    def _run_call(self, pid: int, env: dict[str, str], stdin: bytes) -> bytes:
        try:
            rc, out, stderr = self.server.on_call(env, stdin)
        except Exception as err:  # a bug in one call must not take the agent down
            # Answered as a refusal, not a CNI result: the executable then runs the
            # call itself, as when no agent answers.
            log.exception("CNI call from pid %d failed", pid)
            return self._encode({"error": f"internal error: {err!r}"})
        return frames.answer_frame(rc, out, stderr)

    def _run_request(self, pid: int, request: dict[str, Any]) -> bytes:
        try:
            answer = self.server.on_request(request)
        except Exception as err:  # a bug in one request must not take the agent down
            log.exception("request from pid %d failed", pid)
            answer = {"error": f"internal error: {err!r}"}
        return self._encode(answer)

    @staticmethod
    def _encode(answer: dict[str, Any]) -> bytes:
        return json.dumps(answer, separators=(",", ":")).encode()


class AgentServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = socket.SOMAXCONN  # a burst of pod starts connects at once

    def __init__(self, path: str, on_request: RequestHandler, on_call: CallHandler) -> None:
        self.on_request = on_request
        self.on_call = on_call
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.reading = threading.BoundedSemaphore(MAX_READING)
        self.path = path
        prepare_directory(os.path.dirname(path))
        _remove_stale(path)
        staging = f"{path}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        old_umask = os.umask(0o177)  # the socket is born 0600
        try:
            super().__init__(staging, _Connection)
        finally:
            os.umask(old_umask)
        os.chmod(staging, 0o600)
        os.replace(staging, path)
        self.server_address = path

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _caller_gone(sock: socket.socket) -> bool:
    """The peer closed the connection (POLLHUP: both directions; a peer that only
    shut down its sending side still waits for the answer)."""
    poller = select.poll()
    poller.register(sock, select.POLLHUP)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def prepare_directory(directory: str) -> None:
    """The socket's directory, the agent's own and closed to others (0700): one made
    by somebody else (a DaemonSet's hostPath, 0755) is closed; one that others could
    write to (a socket swapped under the agent) is refused."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.geteuid():
        raise ServerError(f'"{directory}" is owned by uid {info.st_uid}, not by the agent')
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise ServerError(f'"{directory}" may be written by others (mode {info.st_mode:o})')
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(directory, 0o700)


def _remove_stale(path: str) -> None:
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: left by an agent that died
        return
    finally:
        probe.close()
    raise ServerError(f'another agent already serves "{path}"')
