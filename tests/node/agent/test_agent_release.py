"""The agent serves only launchers of its own release: ADD, CHECK and STATUS sent by
another (or by one that does not name its release) get code 11 and a message naming
both; DEL and GC always run."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.plugin import frames, release
from cni.plugin.client import exchange
from tests.harness.agent import AgentNetwork, k8s_args
from tests.harness.cni_run import PodNamespaces

OTHER = "0.0.1"


@pytest.fixture
def net(tmp_path: Path, bin_dir: Path) -> Iterator[AgentNetwork]:
    made = AgentNetwork.create(tmp_path, bin_dir)
    try:
        made.start()
        yield made
    finally:
        made.cleanup()


def env_of(command: str, netns: str, cid: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": k8s_args("x", "a"),
    }


def frame_without_release(env: dict[str, str], stdin: bytes) -> bytes:
    entries = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    return frames.CALL_HEAD.pack(b"C", frames.VERSION, len(entries)) + entries + stdin


def send(net: AgentNetwork, body: bytes) -> tuple[int, dict]:
    rc, out, _ = frames.parse_answer(exchange(net.socket, body, timeout=60))
    return rc, json.loads(out) if out else {}


def test_the_frame_names_the_senders_release() -> None:
    env, _ = frames.parse_call(frames.call_frame({"CNI_COMMAND": "ADD"}, b"{}"))
    assert env[release.CALLER_KEY] == release.VERSION
    env, _ = frames.parse_call(frames.call_frame({release.CALLER_KEY: "forged"}, b"{}"))
    assert env[release.CALLER_KEY] == release.VERSION  # the sender's own goes last


def test_a_launcher_of_another_release_is_refused(net: AgentNetwork, pods: PodNamespaces) -> None:
    netns = pods.new()
    config = net.config()
    stdin = json.dumps(config).encode()
    for command in ("ADD", "STATUS"):
        for body in (
            frames.call_frame(env_of(command, netns, "c1"), stdin, caller_release=OTHER),
            frame_without_release(env_of(command, netns, "c1"), stdin),
        ):
            rc, error = send(net, body)
            assert rc == 1 and error["code"] == 11, error
            assert release.VERSION in error["details"] and "sluicectl install" in error["details"]
    rc, error = send(
        net, frames.call_frame(env_of("ADD", netns, "c1"), stdin, caller_release=OTHER)
    )
    assert f"release {OTHER}" in error["details"], error
    assert net.endpoints() == []  # nothing was wired

    # The node's own launcher (this release) is served; CHECK from another is refused.
    result = net.add(netns, "c1", "x", "a")
    checked = dict(config, prevResult=result)
    rc, error = send(
        net,
        frames.call_frame(
            env_of("CHECK", netns, "c1"), json.dumps(checked).encode(), caller_release=OTHER
        ),
    )
    assert rc == 1 and error["code"] == 11 and OTHER in error["details"], error

    # DEL must always succeed: it runs whoever sent it.
    rc, answer = send(
        net, frames.call_frame(env_of("DEL", netns, "c1"), stdin, caller_release=OTHER)
    )
    assert rc == 0, answer
    assert net.endpoints() == []


def test_struct_of_the_call_head_is_unchanged() -> None:
    # An older launcher's frame still parses (the release is just one more entry).
    assert frames.CALL_HEAD.format == struct.Struct(">cII").format
