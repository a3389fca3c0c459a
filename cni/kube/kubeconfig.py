"""Where the API server is and how to authenticate to it: a kubeconfig file's current
context, or the pod's service account.

Read here rather than through a client library's loader: importing one loads its
typed models, an asyncio client and more (about 6 MB of an agent's resident memory,
which otherwise holds the objects of its node only). Supported, as kubectl reads
them: ``server``, ``certificate-authority`` (``-data``), ``insecure-skip-tls-verify``;
``client-certificate``/``client-key`` (``-data``), ``token``, ``tokenFile``,
``username``/``password`` and ``exec`` credential plugins (run with a timeout,
and again once their token's ``expirationTimestamp`` has passed). Relative paths
are relative to the kubeconfig's directory.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import tempfile
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"
EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
)
# A credential plugin that does not answer in this time is stopped, and the request
# that needed it fails (and is retried as any other failed request is).
EXEC_TIMEOUT_SECONDS = 10.0


class ConfigError(ValueError):
    """The kubeconfig or the service account cannot be used."""


@dataclass(frozen=True)
class Connection:
    server: str
    verify: ssl.SSLContext
    auth: httpx.Auth | None


def load(kubeconfig: str | None = None) -> Connection:
    """The connection of ``kubeconfig``'s current context; without one, the pod's
    service account when in a pod, else ``$KUBECONFIG``, else ``~/.kube/config``."""
    if kubeconfig:
        return from_file(kubeconfig)
    if (SERVICE_ACCOUNT / "token").is_file() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return from_service_account()
    return from_file(os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG)


def from_service_account(account: Path = SERVICE_ACCOUNT) -> Connection:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    return Connection(f"https://{host}:{port}", context, TokenFileAuth(account / "token"))


def from_file(path: str) -> Connection:
    file = Path(path).expanduser()
    try:
        conf = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"kubeconfig {path} cannot be read: {err}") from None
    if not isinstance(conf, Mapping):
        raise ConfigError(f"kubeconfig {path} is not a mapping")
    current = conf.get("current-context")
    if not current:
        raise ConfigError(f"kubeconfig {path} has no current-context")
    context = _named(conf, "contexts", "context", current, path)
    cluster = _named(conf, "clusters", "cluster", context.get("cluster"), path)
    user = _named(conf, "users", "user", context["user"], path) if context.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise ConfigError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server")
    base = file.parent

    def at(name: str) -> str:
        return str(base / os.path.expanduser(name))

    return Connection(str(server), _ssl_context(cluster, user, at), _auth(user, at))


def _named(conf: Mapping[str, Any], section: str, field: str, name: object, path: str) -> Any:
    for entry in conf.get(section) or ():
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(field) or {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"kubeconfig {path}: {section} {name!r} is not a mapping")
            return value
    raise ConfigError(f"kubeconfig {path}: no {section} entry named {name!r}")


def _ssl_context(cluster: Mapping[str, Any], user: Mapping[str, Any], at: Any) -> ssl.SSLContext:
    if cluster.get("certificate-authority-data"):
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
    elif cluster.get("certificate-authority"):
        context = ssl.create_default_context(cafile=at(cluster["certificate-authority"]))
    else:
        context = httpx.create_ssl_context(verify=not cluster.get("insecure-skip-tls-verify"))
    cert = _pem(user, "client-certificate", at)
    key = _pem(user, "client-key", at)
    if cert and key:
        # load_cert_chain reads files only: the two in one, for the moment of loading.
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as chain:
            chain.write(cert + "\n" + key)
            chain.flush()
            context.load_cert_chain(chain.name)
    return context


def _pem(user: Mapping[str, Any], field: str, at: Any) -> str:
    if user.get(f"{field}-data"):
        return base64.b64decode(user[f"{field}-data"]).decode()
    if user.get(field):
        return Path(at(user[field])).read_text()
    return ""


def _auth(user: Mapping[str, Any], at: Any) -> httpx.Auth | None:
    if user.get("tokenFile"):
        return TokenFileAuth(Path(at(user["tokenFile"])))
    if user.get("token"):
        return BearerAuth(str(user["token"]))
    if user.get("exec"):
        return ExecAuth(user["exec"])
    if user.get("username") and user.get("password"):
        return httpx.BasicAuth(user["username"], user["password"])
    if user.get("auth-provider"):
        raise ConfigError("kubeconfig: auth-provider is not supported (use exec)")
    return None


class BearerAuth(httpx.Auth):
    def __init__(self, token: str) -> None:
        self.header = f"Bearer {token.strip()}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self.header
        yield request


class TokenFileAuth(httpx.Auth):
    """A token read from a file, read again after a 401: the kubelet rotates a service
    account's token in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = ""

    def _read(self) -> str:
        try:
            return f"Bearer {self.path.read_text().strip()}"
        except OSError as err:
            raise ConfigError(f"token file {self.path} cannot be read: {err}") from None

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self.header = self.header or self._read()
        request.headers["Authorization"] = self.header
        response = yield request
        if response.status_code == 401:
            self.header = self._read()
            request.headers["Authorization"] = self.header
            yield request


@dataclass(frozen=True)
class ExecCredential:
    header: str
    expires: float | None  # time.time() after which the plugin is asked again; None: never


def parse_exec_credential(output: bytes, command: str) -> ExecCredential:
    """A credential plugin's ExecCredential: its token, and when it expires
    (``status.expirationTimestamp``, RFC 3339)."""
    try:
        status = json.loads(output)["status"]
        token = status["token"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"credential plugin {command} printed no status.token: {err!r}") from None
    if not isinstance(token, str) or not token:
        raise ConfigError(f"credential plugin {command} printed an empty token")
    expiry = status.get("expirationTimestamp")
    if not expiry:
        return ExecCredential(f"Bearer {token}", None)
    try:
        expires = datetime.fromisoformat(str(expiry).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"credential plugin {command}: expirationTimestamp {expiry!r} is not RFC 3339"
        ) from None
    if expires.tzinfo is None:
        raise ConfigError(f"credential plugin {command}: expirationTimestamp {expiry!r}: no zone")
    return ExecCredential(f"Bearer {token}", expires.timestamp())


class ExecAuth(httpx.Auth):
    """A token from a credential plugin (``users[].user.exec``): asked again once the
    token's ``expirationTimestamp`` has passed, and after a 401; a plugin that does
    not answer within ``timeout`` seconds is stopped. One plugin run at a time serves
    every thread of the client."""

    def __init__(self, spec: Mapping[str, Any], timeout: float = EXEC_TIMEOUT_SECONDS) -> None:
        if spec.get("apiVersion") not in EXEC_API_VERSIONS:
            raise ConfigError(f"kubeconfig: exec apiVersion {spec.get('apiVersion')!r}")
        self.spec = spec
        self.timeout = timeout
        self.credential: ExecCredential | None = None
        self._running = threading.Lock()

    def _run(self) -> ExecCredential:
        import subprocess  # only with a credential plugin

        env = dict(os.environ)
        env.update({e["name"]: e["value"] for e in self.spec.get("env") or ()})
        command = [self.spec["command"], *(self.spec.get("args") or ())]
        try:
            # A session of its own: on a timeout, whatever it started is stopped too.
            plugin = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise ConfigError(f"credential plugin {command[0]} cannot run: {err}") from None
        try:
            stdout, stderr = plugin.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(plugin.pid, signal.SIGKILL)
            plugin.communicate()
            raise ConfigError(
                f"credential plugin {command[0]} did not answer in {self.timeout:g} s"
            ) from None
        if plugin.returncode != 0:
            raise ConfigError(
                f"credential plugin {command[0]} exited with {plugin.returncode}: "
                f"{stderr.decode(errors='replace').strip()}"
            )
        return parse_exec_credential(stdout, command[0])

    def _header(self, refused: str = "") -> str:
        """The current token's header; the plugin is run when there is none, when it
        has expired, or when the server refused ``refused`` (unless another thread has
        already replaced it)."""
        with self._running:
            held = self.credential
            if (
                held is None
                or (held.expires is not None and time.time() >= held.expires)
                or held.header == refused
            ):
                held = self.credential = self._run()
            return held.header

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        header = self._header()
        request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = self._header(refused=header)
            yield request
