"""Certificates, keys, tokens and kubeconfigs for a private cluster (openssl, no CA tools).

One CA signs the API server's serving certificate; an RSA pair signs service account
tokens; every client (admin, the components, the sluice agent) authenticates with a
static bearer token from the API server's token file.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

CERT_DAYS = 30
ADMIN_GROUP = "system:masters"


def openssl(*args: str | Path) -> None:
    argv = ["openssl", *map(str, args)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class ClusterPki:
    """Paths of the files ``create_pki`` writes into ``directory``."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "service-account.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "service-account.pub"

    @property
    def token_file(self) -> Path:
        return self.directory / "tokens.csv"


def create_pki(
    directory: Path, *, ip_sans: list[str], dns_sans: list[str], users: dict[str, str]
) -> tuple[ClusterPki, dict[str, str]]:
    """Write CA, serving cert, service account keys and a token file for ``users``.

    ``users`` maps a client name to its Kubernetes user name; every user gets the
    admin group. Returns the paths and each client's bearer token.
    """
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = ClusterPki(directory)
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", pki.ca_key, "-out", pki.ca_cert, "-days", str(CERT_DAYS),
        "-subj", "/CN=sluice-test-cluster-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    csr = directory / "apiserver.csr"
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", pki.apiserver_key, "-out", csr, "-subj", "/CN=kube-apiserver",
    )  # fmt: skip
    sans = [f"IP:{ip}" for ip in ip_sans] + [f"DNS:{name}" for name in dns_sans]
    extensions = directory / "apiserver.ext"
    extensions.write_text(
        f"subjectAltName={','.join(sans)}\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", csr, "-CA", pki.ca_cert, "-CAkey", pki.ca_key,
        "-set_serial", str(secrets.randbits(63)), "-days", str(CERT_DAYS),
        "-extfile", extensions, "-out", pki.apiserver_cert,
    )  # fmt: skip
    csr.unlink()
    extensions.unlink()
    openssl("genrsa", "-out", pki.service_account_key, "2048")
    openssl("rsa", "-in", pki.service_account_key, "-pubout", "-out", pki.service_account_pub)
    tokens = {client: secrets.token_hex(24) for client in users}
    lines = [f'{tokens[c]},{user},{user},"{ADMIN_GROUP}"' for c, user in users.items()]
    pki.token_file.write_text("\n".join(lines) + "\n")
    for path in directory.iterdir():
        path.chmod(0o600)
    return pki, tokens


def write_kubeconfig(path: Path, *, server: str, ca_cert: Path, token: str, user: str) -> Path:
    """A kubeconfig (JSON is valid YAML) with one cluster, one user and one context."""
    ca_data = base64.b64encode(ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sluice", "cluster": {"server": server, "certificate-authority-data": ca_data}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sluice", "context": {"cluster": "sluice", "user": user}}],
        "current-context": "sluice",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path
