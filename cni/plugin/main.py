"""Entry point of the ``sluice`` CNI plugin.

Only the standard library is imported here, and VERSION is answered before
even the json module is loaded (it costs more than the rest of the answer).
Every other verb goes to the node agent first, over its unix socket (the
fast path: the agent keeps everything loaded, and forwarding needs only
``_socket`` and ``_struct``, not even json); when no agent answers, the verb
runs in this process, where each verb's module is imported only when that
verb runs. A network whose policy is enforced never wires a pod
without the agent: ADD and CHECK then fail with code 11.
"""

import posix
import sys

# No `from __future__ import annotations`, no `os`, no `typing`: each costs this
# once-per-call process more than a forwarded call's answer. Annotations naming
# types that only type checkers import are written as strings.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn

    from cni.spec.errors import CNIError


VERB_MODULES = {
    "ADD": "cni.plugin.verbs.add",
    "DEL": "cni.plugin.verbs.delete",
    "CHECK": "cni.plugin.verbs.check",
    "STATUS": "cni.plugin.verbs.status",
    "GC": "cni.plugin.verbs.gc",
}
DEFAULT_AGENT_SOCKET = "/run/sluice/agent.sock"


def main() -> int:
    command = posix.environ.get(b"CNI_COMMAND")
    if command == b"VERSION":
        return answer_version(read_stdin_quietly())
    try:
        stdin = read_stdin()
    except OSError as err:
        from cni.spec import versions

        return emit_error(stdin_error(err), versions.CURRENT)
    forwarded = forward_to_agent(posix.environ, stdin)
    if forwarded is not None:
        finish(forwarded)
    import os

    finish(run_plugin(VERB_MODULES, os.environ, stdin))


def finish(rc: int) -> "NoReturn":
    """Exit now, without the interpreter's teardown (freeing every module and object
    one by one costs a one-call process more than its answer): the output is
    flushed, and every file and socket the call used is closed already or closed
    by the kernel."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # a logFile handler's buffer
    posix._exit(rc)


def run_plugin(verb_modules: "Mapping[str, str]", env: "Mapping[str, str]", stdin: bytes) -> int:
    """Run one CNI call in this process: print the result or the error JSON on stdout,
    return the exit code."""
    from cni.spec.call import execute

    rc, out = execute(env, stdin, lambda request: load_verb(verb_modules[request.command])(request))
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    return rc


def forward_to_agent(env: "Mapping[bytes, bytes]", stdin: bytes) -> int | None:
    """Run the call in the agent when one answers; None to run it here. ``env`` is the
    environment as the kernel gave it (bytes), passed on untouched."""
    socket_path = agent_socket_of(stdin)
    if socket_path is None:
        return None
    from cni.plugin.client import AgentUnavailable, forward

    try:
        rc, out, err = forward(socket_path, env, stdin)
    except AgentUnavailable:  # no agent (the socket is missing or refuses), or it died
        return None
    if err:
        sys.stderr.write(err)
    sys.stdout.write(out)
    sys.stdout.flush()
    return rc


def agent_socket_of(stdin: bytes) -> str | None:
    """The agent socket the configuration names. Read without a JSON parser: json
    imports re, which costs more on a busy node than the whole forwarded call.
    Anything the scanner cannot vouch for goes through json; anything unreadable
    is left to the agent, which reports it as the in-process call would."""
    if b'"agentSocket"' not in stdin:
        return DEFAULT_AGENT_SOCKET
    found = top_level_string(stdin, "agentSocket")
    if found is None:
        found = DEFAULT_AGENT_SOCKET
    elif found is UNSURE:
        import json

        try:
            config = json.loads(stdin)
        except ValueError:
            return None
        if not isinstance(config, dict):
            return None
        found = config.get("agentSocket", DEFAULT_AGENT_SOCKET)
    return found if isinstance(found, str) and found.startswith("/") else None


UNSURE = object()  # top_level_string could not tell: ask the JSON parser


def top_level_string(stdin: bytes, key: str) -> object:
    """The plain string value of ``key`` in the top-level JSON object of ``stdin``,
    None when the object has no such key, or ``UNSURE`` (an escaped value, a value
    that is not a string, the key twice, or text that is not one object)."""
    try:
        text = stdin.decode()
    except UnicodeDecodeError:
        return UNSURE
    if not text.lstrip().startswith("{"):
        return UNSURE
    depth = 0
    found: object = None
    i, end = 0, len(text)
    while i < end:
        char = text[i]
        if char == '"':
            close = string_end(text, i)
            if close < 0:
                return UNSURE
            if depth == 1 and text[i + 1 : close] == key:
                rest = text[close + 1 :].lstrip()
                if found is not None or not rest.startswith(":"):
                    return UNSURE
                rest = rest[1:].lstrip()
                value_end = rest.find('"', 1)
                if not rest.startswith('"') or value_end < 0 or "\\" in rest[1:value_end]:
                    return UNSURE
                found = rest[1:value_end]
            i = close + 1
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        i += 1
    return found if depth == 0 else UNSURE


def string_end(text: str, start: int) -> int:
    """Index of the quote closing the JSON string opened at ``start``; -1 if none."""
    j = start + 1
    while True:
        close = text.find('"', j)
        if close < 0:
            return -1
        k = close - 1
        while text[k] == "\\":
            k -= 1
        if (close - 1 - k) % 2 == 0:  # an even run of backslashes: the quote is real
            return close
        j = close + 1


def answer_version(stdin: bytes) -> int:
    from cni.spec import versions

    echoed = versions.echoed_version(peek_version(stdin))
    from cni.plugin.release import VERSION as RELEASE

    supported = ", ".join(f'"{v}"' for v in versions.SUPPORTED)
    # sluiceVersion: the release, beside the spec's fields (runtimes ignore a key they
    # do not know), so that what a node runs can be asked of the plugin itself.
    sys.stdout.write(
        f'{{"cniVersion": "{echoed}", "supportedVersions": [{supported}], '
        f'"sluiceVersion": "{RELEASE}"}}\n'
    )
    return 0


def peek_version(stdin: bytes) -> str | None:
    """The cniVersion of a VERSION request, found without a JSON parser.

    Anything unexpected yields None; only known versions are echoed.
    """
    _, found, rest = stdin.decode(errors="replace").partition('"cniVersion"')
    if not found:
        return None
    _, colon, rest = rest.partition(":")
    parts = rest.lstrip().split('"', 2)
    return parts[1] if colon and len(parts) == 3 and parts[0] == "" else None


def read_stdin() -> bytes:
    """Everything on stdin; OSError when it cannot be read (see ``stdin_error``)."""
    return sys.stdin.buffer.read()


def stdin_error(err: OSError) -> "CNIError":
    from cni.spec.errors import ERR_IO, CNIError

    return CNIError(ERR_IO, f"failed to read the network configuration from stdin: {err}")


def read_stdin_quietly() -> bytes:
    try:
        return sys.stdin.buffer.read()
    except OSError:
        return b""


def load_verb(module_name: str) -> "Callable[[Any], dict[str, Any] | None]":
    import importlib

    return importlib.import_module(module_name).run


def emit_error(err: "CNIError", version: str) -> int:
    import json

    sys.stdout.write(json.dumps(err.to_json(version), indent=2) + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
