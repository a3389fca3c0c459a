"""Build the sluice image from the repository's ``Dockerfile``, and write it as an OCI tar.

The version comes from one place, ``cni/plugin/release.py`` (pyproject.toml reads it
from there): it is the image's tag
(``localhost/sluice:<version>``), its ``org.opencontainers.image.version`` label,
the ``VERSION`` build argument, and what ``sluicectl --version`` prints inside
(the build fails otherwise). The base is the Debian 12 image made here
(``debian_base``), since no registry is reachable; the build's package
installs use the host's network (Debian's mirror and PyPI only). The OCI tar
(``/var/cache/sluice/images/sluice-<version>.oci.tar``) is what a node's
containerd loads with ``ctr images import``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from cni.plugin import release
from tests.harness import debian_base, oci_layout

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "localhost/sluice"
VERSION_LABEL = "org.opencontainers.image.version"
BUILD_LOG = debian_base.CACHE_DIR / "sluice-image-build.log"


LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


def local_ca_certs() -> str:
    """The site's own CAs (Debian keeps them in /usr/local/share/ca-certificates), for
    builds whose HTTPS goes through a proxy that presents certificates of its own."""
    if not LOCAL_CA_DIR.is_dir():
        return ""
    return "".join(p.read_text() for p in sorted(LOCAL_CA_DIR.glob("**/*.crt")))


def version() -> str:
    return release.VERSION


def image_name(ver: str | None = None) -> str:
    return f"{REPOSITORY}:{ver or version()}"


def oci_tar_path(ver: str | None = None) -> Path:
    return debian_base.CACHE_DIR / f"sluice-{ver or version()}.oci.tar"


@dataclass(frozen=True)
class Built:
    name: str
    image_id: str
    size: int
    seconds: float


class BuildFailed(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[sluice-image] {message}", file=sys.stderr, flush=True)


def docker_build(
    client: docker.DockerClient,
    *,
    context: Path,
    dockerfile: str,
    tag: str,
    buildargs: dict[str, str],
    log_file: Path,
    labels: dict[str, str] | None = None,
) -> str:
    """A classic-builder build through the SDK; returns the image id. Logs go to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    image_id = None
    tail: list[str] = []
    with log_file.open("w") as out:
        stream = client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs=buildargs,
            labels=labels,
            network_mode="host",  # the package registries, without NAT rules on the host
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            text = chunk.get("stream") or chunk.get("status") or ""
            if text:
                out.write(text)
                tail = (tail + text.splitlines())[-40:]
            if "error" in chunk:
                out.write(chunk["error"] + "\n")
                raise BuildFailed(
                    f"docker build of {tag} ({context}/{dockerfile}) failed: {chunk['error']}\n"
                    + "\n".join(tail)
                    + f"\n(full log: {log_file})"
                )
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    if image_id is None:
        image_id = client.images.get(tag).id
    return image_id


def build(client: docker.DockerClient) -> Built:
    """Build (or bring up to date, through the layer cache) the sluice image."""
    ver = version()
    name = image_name(ver)
    started = time.monotonic()
    base = debian_base.ensure_image(client)
    image_id = docker_build(
        client,
        context=REPO_ROOT,
        dockerfile="Dockerfile",
        tag=name,
        buildargs={"BASE": base, "VERSION": ver, "BUILD_CA_CERTS": local_ca_certs()},
        log_file=BUILD_LOG,
    )
    image = client.images.get(image_id)
    if image.labels.get(VERSION_LABEL) != ver:
        raise BuildFailed(f"{name} is labelled {image.labels.get(VERSION_LABEL)!r}, not {ver!r}")
    seconds = time.monotonic() - started
    log(f"{name} ({image_id[:19]}): {image.attrs['Size'] / 1e6:.0f} MB in {seconds:.0f} s")
    return Built(name, image_id, int(image.attrs["Size"]), seconds)


def write_oci_tar(client: docker.DockerClient, name: str, dest: Path) -> Path:
    """``docker save`` of ``name`` turned into an OCI layout tar at ``dest``.

    Rewritten only when the image changed (its id is kept beside the tar)."""
    image = client.images.get(name)
    id_file = dest.with_name(dest.name + ".id")
    if dest.is_file() and id_file.is_file() and id_file.read_text() == image.id:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, suffix=".docker.tar") as archive:
        for chunk in image.save(named=True):
            archive.write(chunk)
        archive.flush()
        oci_layout.docker_archive_to_oci(Path(archive.name), dest, name)
    id_file.write_text(image.id)
    return dest


def manifest_digest(oci_tar: Path) -> str:
    """The digest of the image's manifest in an OCI tar: what a reference by digest
    names (kind.load records the image under it on every node)."""
    return oci_layout.name_and_digest(oci_tar)[1]


def pinned_reference(oci_tar: Path) -> str:
    """``localhost/sluice@sha256:...``: the one image of that content, whatever another
    build or a stale import left under the version's tag on a node."""
    return f"{REPOSITORY}@{manifest_digest(oci_tar)}"


def write_deploy_overlay(
    oci_tar: Path, dest: Path | None = None, settings: dict[str, str] | None = None
) -> Path:
    """A kustomization over ``conf/`` that names the image by its digest (what ``make
    image`` leaves for ``kubectl apply --server-side -k``), with ``settings`` over the
    ConfigMap sluice-config's (``{"SLUICE_ROUTING": "vxlan"}``); its directory."""
    directory = dest or oci_tar.with_name(oci_tar.name.removesuffix(".oci.tar") + ".deploy")
    directory.mkdir(parents=True, exist_ok=True)
    conf = os.path.relpath(REPO_ROOT / "conf", directory)  # kustomize takes no absolute path
    overlay: dict[str, object] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [conf],
        "images": [{"name": REPOSITORY, "digest": manifest_digest(oci_tar)}],
    }
    if settings:
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "sluice-config", "namespace": "kube-system"},
            "data": settings,
        }
        overlay["patches"] = [{"patch": json.dumps(config_map)}]
    (directory / "kustomization.yaml").write_text(
        "# Written by `make image`: conf/ with the image pinned by its digest.\n"
        + json.dumps(overlay, indent=2)
        + "\n"
    )
    return directory


def record(entry: dict[str, object]) -> None:
    """Append a build's figures to the cache's history (the docs quote them)."""
    history_file = debian_base.CACHE_DIR / "build-times.json"
    history: list[object] = []
    if history_file.is_file():
        history = json.loads(history_file.read_text())
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **entry})
    history_file.write_text(json.dumps(history, indent=1) + "\n")
