"""The CNI protocol: environment and config validation, error JSON, versions.

These run the installed plugin as a runtime would; none of them needs a pod.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni.plugin import release
from cni.spec.errors import CNIError
from cni.spec.invoke import Invocation
from cni.spec.protocol import parse_cni_args
from cni.spec.versions import SUPPORTED
from tests.harness.cni_run import Network, PodNamespaces, exec_plugin


def test_version_answers_with_standard_library_only(bin_dir: Path) -> None:
    # libcni sends dummy values with VERSION; stdin carries the caller's version.
    run = exec_plugin(
        bin_dir / "sluice",
        "VERSION",
        {"cniVersion": "0.4.0"},
        netns="dummy",
        ifname="dummy",
        cni_path="dummy",
    ).ok()
    assert run.out == {
        "cniVersion": "0.4.0",
        "supportedVersions": list(SUPPORTED),
        "sluiceVersion": release.VERSION,
    }
    assert run.stderr == ""


@pytest.mark.parametrize("stdin", [b"", b"not json", b'{"cniVersion": "9.9.9"}'])
def test_version_ignores_unusable_stdin(bin_dir: Path, stdin: bytes) -> None:
    run = exec_plugin(bin_dir / "sluice", "VERSION", stdin).ok()
    assert run.out["cniVersion"] == "1.1.0"
    assert "1.1.0" in run.out["supportedVersions"]


def test_version_imports_nothing_heavy(bin_dir: Path) -> None:
    """The launcher's VERSION path must not load pyroute2, json or the verbs."""
    launcher = (bin_dir / "sluice").read_text()
    assert launcher.startswith("#!") and " -IS" in launcher.splitlines()[0]
    probe = launcher.replace(
        "sys.exit(main())",
        (
            "import io\n"
            "sys.stdin = io.TextIOWrapper(io.BytesIO(b'{}'))\n"
            "import os\nos.environ['CNI_COMMAND'] = 'VERSION'\n"
            "main()\n"
            "heavy = [m for m in ('pyroute2', 'json', 'cni.spec.protocol', 'sqlite3', 'click')"
            " if m in sys.modules]\n"
            "print('HEAVY', heavy)\n"
        ),
    )
    script = bin_dir.parent / "version-probe.py"
    script.write_text(probe)
    script.chmod(0o755)
    run = exec_plugin(script, "VERSION", b"{}")
    assert "HEAVY []" in run.stdout, run.stdout + run.stderr


def error_of(run_result: Invocation) -> tuple[int, str]:
    out = run_result.out
    assert run_result.rc != 0
    assert set(out) == {"cniVersion", "code", "msg", "details"}, out
    return out["code"], out["details"]


def test_missing_command_is_code_4(network: Network) -> None:
    code, details = error_of(network.run(""))
    assert code == 4 and "CNI_COMMAND" in details


def test_unknown_command_is_code_4(network: Network) -> None:
    code, details = error_of(network.run("FROB"))
    assert code == 4 and "FROB" in details


def test_stdin_not_json_is_code_6(network: Network) -> None:
    code, _ = error_of(network.run("ADD", b"{nope", container_id="c", netns="/x", ifname="eth0"))
    assert code == 6


def test_missing_and_invalid_network_name_is_code_7(network: Network) -> None:
    config = network.config()
    del config["name"]
    assert error_of(network.run("DEL", config, container_id="c", ifname="eth0"))[0] == 7
    config["name"] = "bad name!"
    code, details = error_of(network.run("DEL", config, container_id="c", ifname="eth0"))
    assert code == 7 and "bad name!" in details


def test_unsupported_version_is_code_1(network: Network) -> None:
    run = network.run("ADD", network.config("2.0.0"), container_id="c", netns="/x", ifname="eth0")
    code, details = error_of(run)
    assert code == 1 and "2.0.0" in details
    assert run.out["cniVersion"] == "1.1.0"


@pytest.mark.parametrize(
    ("command", "version"), [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "1.0.0")]
)
def test_verb_needs_its_spec_version(network: Network, command: str, version: str) -> None:
    run = network.run(command, network.config(version), container_id="c", netns="/x", ifname="eth0")
    code, details = error_of(run)
    assert code == 1 and command in details
    assert run.out["cniVersion"] == version  # errors speak the request's version


def test_add_missing_env_names_the_variables(network: Network) -> None:
    code, details = error_of(network.run("ADD", ifname="eth0"))
    assert code == 4
    assert "CNI_CONTAINERID" in details and "CNI_NETNS" in details


@pytest.mark.parametrize("container_id", ["-leading-dash", "has space", "semi;colon"])
def test_invalid_container_id_is_code_4(network: Network, container_id: str) -> None:
    code, details = error_of(network.run("DEL", container_id=container_id, ifname="eth0"))
    assert code == 4 and "CNI_CONTAINERID" in details


@pytest.mark.parametrize("ifname", ["a" * 16, ".", "..", "eth/0", "eth:0", "eth 0"])
def test_invalid_ifname_is_code_4(network: Network, ifname: str) -> None:
    code, details = error_of(network.run("DEL", container_id="c", ifname=ifname))
    assert code == 4 and "CNI_IFNAME" in details


def test_unknown_cni_args_rejected_unless_ignored(network: Network) -> None:
    code, details = error_of(
        network.run("DEL", container_id="c", ifname="eth0", cni_args="FOO=bar")
    )
    assert code == 4 and "FOO" in details
    network.run("DEL", container_id="c", ifname="eth0", cni_args="IgnoreUnknown=1;FOO=bar").ok()


def test_cni_args_parsing() -> None:
    args = parse_cni_args(
        "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0;K8S_POD_UID=u;K8S_POD_INFRA_CONTAINER_ID=abc"
    )
    assert args["K8S_POD_NAME"] == "web-0"
    assert parse_cni_args("IgnoreUnknown=true;X=1;Y=") == {
        "IgnoreUnknown": "true",
        "X": "1",
        "Y": "",
    }
    assert parse_cni_args("") == {}
    for bad in ("novalue", "=v", "IgnoreUnknown=maybe"):
        with pytest.raises(CNIError) as err:
            parse_cni_args(bad)
        assert err.value.code == 4


@pytest.mark.parametrize(
    ("key", "value", "code", "fragment"),
    [
        ("mtu", 70000, 7, '"mtu" 70000'),
        ("mtu", "1500", 7, "\"mtu\" '1500'"),
        ("ipMasq", "yes", 7, "\"ipMasq\" 'yes'"),
        ("policy", "audit", 7, "'audit'"),
        ("stateDir", "relative/dir", 7, "relative/dir"),
        ("ipam", {"subnet": "10.0.0.0/24"}, 7, '"ipam"'),
        ("ipam", {"type": "sluice-ipam", "subnet": "fd00::/64"}, 2, "fd00::/64"),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.0/31"}, 7, "too small"),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.1/24"}, 7, "host bits"),
        (
            "ipam",
            {"type": "sluice-ipam", "subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"},
            7,
            "10.0.1.5",
        ),
        ("ipam", {"type": "sluice-ipam", "subnet": "10.0.0.0/24", "mode": "magic"}, 2, "magic"),
        (
            "ipam",
            {"type": "sluice-ipam", "subnet": "10.0.0.0/24", "cooldownSeconds": -1},
            7,
            "cooldownSeconds",
        ),
    ],
)
def test_invalid_config_values_are_named(
    network: Network, pods: PodNamespaces, key: str, value: object, code: int, fragment: str
) -> None:
    netns = pods.new()
    run = network.run(
        "ADD", network.config(**{key: value}), container_id="c", netns=netns, ifname="eth0"
    )
    got, details = error_of(run)
    assert got == code, details
    assert fragment in details
    assert network.veths() == [] and network.allocations() == {}


def test_enforce_policy_needs_the_agent(network: Network, pods: PodNamespaces) -> None:
    netns = pods.new()
    config = network.config(policy="enforce", agentSocket=f"{network.state_dir}/none.sock")
    code, details = error_of(
        network.run("ADD", config, container_id="c", netns=netns, ifname="eth0")
    )
    assert code == 11 and "agent" in details
    assert network.veths() == [] and network.allocations() == {}
    # Nothing to undo, but DEL and GC still work without the agent.
    network.run("DEL", config, container_id="c", netns=netns, ifname="eth0").ok()
    network.run("GC", config).ok()
    code, details = error_of(network.run("STATUS", config))
    assert code == 50 and "agent" in details


def test_errors_are_json_on_stdout_and_logs_on_stderr(network: Network) -> None:
    run = network.run("ADD", b"[]", container_id="c", netns="/x", ifname="eth0")
    assert json.loads(run.stdout)["code"] == 6
    assert "Traceback" not in run.stderr
