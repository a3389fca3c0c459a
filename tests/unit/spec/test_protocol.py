"""The execution protocol: environment and stdin in, a validated request or a CNI
error with the right code out. No plugin process, no kernel."""

from __future__ import annotations

import json

import pytest

from cni.plugin.main import DEFAULT_AGENT_SOCKET, agent_socket_of, peek_version
from cni.spec.errors import CNIError
from cni.spec.protocol import parse_cni_args, parse_request, requested_mac, valid_attachments

ENV = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/p", "CNI_IFNAME": "eth0"}
CONFIG = {"cniVersion": "1.1.0", "name": "net1", "type": "sluice"}


def request(command: str = "ADD", env: dict[str, str] | None = None, **config: object):
    return parse_request(command, {**ENV, **(env or {})}, json.dumps({**CONFIG, **config}).encode())


def code_of(call) -> int:
    with pytest.raises(CNIError) as err:
        call()
    return err.value.code


def test_a_valid_request_is_typed() -> None:
    req = request(env={"CNI_ARGS": "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;IgnoreUnknown=1"})
    att = req.attachment
    assert (att.network, att.container_id, att.ifname, att.netns) == (
        "net1",
        "c1",
        "eth0",
        "/run/netns/p",
    )
    assert (att.pod_namespace, att.pod_name) == ("shop", "cart-0")
    assert att.node_veth.startswith("sl") and len(att.node_veth) == 14
    assert att.alias == "sluice/net1/c1/eth0"


@pytest.mark.parametrize(
    ("stdin", "code"),
    [(b"not json", 6), (b"[1]", 6), (b'{"cniVersion": 1, "name": "n"}', 6)],
)
def test_undecodable_stdin(stdin: bytes, code: int) -> None:
    assert code_of(lambda: parse_request("ADD", ENV, stdin)) == code


def test_versions_and_verbs() -> None:
    assert code_of(lambda: request(cniVersion="9.9.9")) == 1
    assert code_of(lambda: request("CHECK", cniVersion="0.3.1")) == 1
    assert code_of(lambda: request("STATUS", cniVersion="1.0.0")) == 1
    assert request("GC").command == "GC"
    # No cniVersion means 0.1.0, as libcni reads it.
    assert parse_request("DEL", ENV, b'{"name": "n"}').cni_version == "0.1.0"


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"CNI_CONTAINERID": ""}, 4),
        ({"CNI_CONTAINERID": "-x"}, 4),
        ({"CNI_IFNAME": "a" * 16}, 4),
        ({"CNI_IFNAME": "eth/0"}, 4),
        ({"CNI_NETNS": ""}, 4),
        ({"CNI_ARGS": "FOO=bar"}, 4),
        # bytes that are not UTF-8, as os.environ decodes them (surrogateescape)
        ({"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=\udcff\udcfe"}, 4),
        ({"CNI_IFNAME": "eth\udcff"}, 4),
        ({"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=a\x1b[2Jb"}, 4),
    ],
)
def test_invalid_environment_is_code_4(env: dict[str, str], code: int) -> None:
    assert code_of(lambda: request(env=env)) == code


def test_network_name_is_required_and_checked() -> None:
    assert code_of(lambda: request(name="")) == 7
    assert code_of(lambda: request(name="bad name")) == 7


def test_errors_speak_the_requests_version() -> None:
    with pytest.raises(CNIError) as err:
        request(cniVersion="0.4.0", env={"CNI_IFNAME": ""})
    assert err.value.to_json(err.value.cni_version or "")["cniVersion"] == "0.4.0"


def test_cni_args() -> None:
    assert parse_cni_args("IgnoreUnknown=true;X=1;Y=") == {
        "IgnoreUnknown": "true",
        "X": "1",
        "Y": "",
    }
    assert parse_cni_args("") == {}
    for bad in ("novalue", "=v", "IgnoreUnknown=maybe"):
        assert code_of(lambda bad=bad: parse_cni_args(bad)) == 4


def test_runtime_mac_is_matched_case_insensitively() -> None:
    req = request(capabilities={"mac": True}, runtimeConfig={"Mac": "0A:58:0A:F4:01:05"})
    assert requested_mac(req) == "0a:58:0a:f4:01:05"
    undeclared = request(capabilities={}, runtimeConfig={"mac": "0a:58:0a:f4:01:05"})
    assert requested_mac(undeclared) is None
    assert code_of(lambda: requested_mac(request(env={"CNI_ARGS": "MAC=zz"}))) == 7


def test_valid_attachments() -> None:
    assert valid_attachments({}) == set()
    assert valid_attachments({"cni.dev/valid-attachments": None}) == set()
    listed = [{"containerID": "a", "ifname": "eth0"}]
    assert valid_attachments({"cni.dev/valid-attachments": listed}) == {("a", "eth0")}
    assert valid_attachments({"cni.dev/attachments": listed}) == {("a", "eth0")}
    assert code_of(lambda: valid_attachments({"cni.dev/valid-attachments": [{"x": 1}]})) == 6


@pytest.mark.parametrize(
    ("stdin", "version"),
    [
        (b'{"cniVersion": "0.4.0"}', "0.4.0"),
        (b'{"cniVersion":"1.0.0","name":"x"}', "1.0.0"),
        (b"", None),
        (b'{"cniVersion": 1}', None),
        (b"garbage", None),
    ],
)
def test_version_is_peeked_without_json(stdin: bytes, version: str | None) -> None:
    assert peek_version(stdin) == version


def _socket_by_json(stdin: bytes) -> str | None:
    """What the executable's scan must agree with: the JSON parser's answer."""
    if b'"agentSocket"' not in stdin:
        return DEFAULT_AGENT_SOCKET
    try:
        config = json.loads(stdin)
    except ValueError:
        return None
    path = config.get("agentSocket", DEFAULT_AGENT_SOCKET) if isinstance(config, dict) else None
    return path if isinstance(path, str) and path.startswith("/") else None


@pytest.mark.parametrize(
    "stdin",
    [
        b'{"agentSocket": "/run/a.sock"}',
        b'{"ipam": {"agentSocket": "/nested"}, "agentSocket": "/top"}',
        b'{"ipam": {"agentSocket": "/nested"}}',
        b'{"s": "q\\"agentSocket\\"", "agentSocket": "/y"}',
        b'{"agentSocket": "/a\\/b"}',
        b'{"a": "\\\\", "agentSocket": "/z"}',
        b'{"agentSocket": 3}',
        b'{"agentSocket": "relative"}',
        b'[{"agentSocket": "/a"}]',
        b'{nope "agentSocket"',
        b'{"agentSocket": "/a", "agentSocket": "/b"}',
        b'  {"agentSocket" : "/sp" , "k": [1, {"agentSocket": "/x"}]}',
        b'{"agentSocket": "/\xc3\xa9"}',
        b'{"agentSocket": "/a"',
        b'{"name": "n"}',
    ],
)
def test_agent_socket_found_without_json_as_json_finds_it(stdin: bytes) -> None:
    assert agent_socket_of(stdin) == _socket_by_json(stdin)
