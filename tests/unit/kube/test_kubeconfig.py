"""The kubeconfig reader: the current context's server, TLS settings and credentials."""

from __future__ import annotations

import base64
import json
import ssl
import time
from pathlib import Path

import pytest

from cni.kube import kubeconfig
from cni.kube.kubeconfig import BearerAuth, ConfigError, TokenFileAuth


def write(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> str:
    conf = {
        "current-context": "here",
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere"}},
            {"name": "here", "context": {"cluster": "c", "user": "u"}},
        ],
        "clusters": [
            {"name": "c", "cluster": cluster or {"server": "https://192.0.2.1:6443"}},
        ],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(json.dumps(conf))  # JSON is YAML
    return str(path)


def test_the_current_context_with_a_token(tmp_path: Path) -> None:
    conn = kubeconfig.load(write(tmp_path / "config", {"token": "s3cret"}))
    assert conn.server == "https://192.0.2.1:6443"
    assert isinstance(conn.auth, BearerAuth) and conn.auth.header == "Bearer s3cret"


def test_a_token_file_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    conn = kubeconfig.load(write(tmp_path / "config", {"tokenFile": "token"}))
    assert isinstance(conn.auth, TokenFileAuth)
    assert conn.auth.path == tmp_path / "token"
    assert conn.auth._read() == "Bearer abc"


def test_a_certificate_authority_that_is_not_pem_is_refused(tmp_path: Path) -> None:
    cluster = {
        "server": "https://192.0.2.1:6443",
        "certificate-authority-data": base64.b64encode(b"not a certificate").decode(),
    }
    with pytest.raises(ssl.SSLError):
        kubeconfig.load(write(tmp_path / "config", {}, cluster))


def test_errors_name_the_file_and_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        kubeconfig.load(str(tmp_path / "absent"))
    path = tmp_path / "config"
    path.write_text(json.dumps({"contexts": []}))
    with pytest.raises(ConfigError, match=f"{path} has no current-context"):
        kubeconfig.load(str(path))
    path.write_text(json.dumps({"current-context": "x", "contexts": []}))
    with pytest.raises(ConfigError, match="no contexts entry named 'x'"):
        kubeconfig.load(str(path))


def exec_spec(tmp_path: Path, body: str) -> dict[str, object]:
    """A credential plugin (a shell script) that logs each run to ``runs``."""
    script = tmp_path / "plugin"
    script.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\n{body}\n")
    script.chmod(0o755)
    return {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script)}


def credential(token: str, expiry: str | None = None) -> str:
    status: dict[str, str] = {"token": token}
    if expiry:
        status["expirationTimestamp"] = expiry
    return json.dumps({"kind": "ExecCredential", "status": status})


def plugin_runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines())


def test_an_exec_credential_is_kept_until_its_expiration_then_asked_for_again(
    tmp_path: Path,
) -> None:
    # The token names the second it was made; it expires a second later.
    body = (
        "now=$(date -u +%s); exp=$(date -u -d @$((now + 1)) +%Y-%m-%dT%H:%M:%SZ)\n"
        'printf \'{"status":{"token":"t%s","expirationTimestamp":"%s"}}\' "$now" "$exp"'
    )
    auth = kubeconfig.ExecAuth(exec_spec(tmp_path, body))
    first = auth._header()
    assert auth._header() == first and plugin_runs(tmp_path) == 1
    time.sleep(2.1)
    assert auth._header() != first and plugin_runs(tmp_path) == 2


def test_an_exec_credential_without_expiration_is_kept(tmp_path: Path) -> None:
    auth = kubeconfig.ExecAuth(exec_spec(tmp_path, f"echo '{credential('forever')}'"))
    assert auth._header() == auth._header() == "Bearer forever"
    assert plugin_runs(tmp_path) == 1
    # A 401 for the held token asks again; a 401 for an older one does not.
    assert auth._header(refused="Bearer older") == "Bearer forever"
    assert plugin_runs(tmp_path) == 1
    auth._header(refused="Bearer forever")
    assert plugin_runs(tmp_path) == 2


def test_a_credential_plugin_that_hangs_is_stopped(tmp_path: Path) -> None:
    auth = kubeconfig.ExecAuth(exec_spec(tmp_path, "sleep 60"), timeout=0.5)
    with pytest.raises(ConfigError, match=r"did not answer in 0\.5 s"):
        auth._header()


@pytest.mark.parametrize(
    ("output", "error"),
    [
        ("not json", "no status.token"),
        ('{"status": {}}', "no status.token"),
        ('{"status": {"token": ""}}', "empty token"),
        (credential("t", "tomorrow"), "not RFC 3339"),
        (credential("t", "2030-01-01T00:00:00"), "no zone"),
    ],
)
def test_what_a_plugin_prints_is_checked(output: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        kubeconfig.parse_exec_credential(output.encode(), "plugin")


def test_an_expiration_is_read_as_rfc_3339() -> None:
    got = kubeconfig.parse_exec_credential(credential("t", "2030-01-01T00:00:00Z").encode(), "p")
    assert got.expires == 1893456000.0 and got.header == "Bearer t"
