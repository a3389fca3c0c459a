"""The kubeconfig reader: the current context's server, TLS settings and credentials."""

from __future__ import annotations

import base64
import json
import ssl
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
