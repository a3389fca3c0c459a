"""Build a tiny OCI image-layout tarball around the host's static busybox.

No registry is reachable from the test machines, so the image that containerd runs
(and that the CRI plugin uses as its sandbox image) is assembled here from
Debian's ``busybox-static`` binary. The output is byte-for-byte deterministic for a
given busybox binary and image name, so repeated builds yield the same digests and
``ctr images import`` is a no-op after the first time.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")

# Applets the tests (and people debugging them) want inside the container.
APPLETS = (
    "sh",
    "ash",
    "ip",
    "ping",
    "sleep",
    "nc",
    "cat",
    "echo",
    "hostname",
    "wget",
    "ls",
    "ps",
    "kill",
    "mount",
    "grep",
    "sed",
    "awk",
    "ifconfig",
    "route",
    "true",
    "false",
    "env",
    "id",
    "nslookup",
    "printf",
    "test",
    "[",
    "timeout",
    "nsenter",
    "arp",
    "traceroute",
)

DEFAULT_CMD = ["/bin/sleep", "infinity"]
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"

# Go's GOARCH names, which is what containerd matches image platforms against.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


@dataclass(frozen=True)
class _Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        desc: dict[str, object] = {"mediaType": self.media_type, "digest": self.digest}
        return {**desc, "size": len(self.data), **extra}


def _canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _tar_add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    # Fixed owner and timestamps keep the layer digest stable across builds.
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    if data is None:
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _dir(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    return info


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    return info


def _layer(busybox: bytes, extra_files: Mapping[str, Path]) -> bytes:
    """The single rootfs layer: busybox, its applet links, a minimal /etc and extras."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "root", "sys", "usr", "usr/bin", "var"):
            _tar_add(tar, _dir(d))
        _tar_add(tar, _dir("tmp", 0o1777))
        _tar_add(tar, _file("bin/busybox", 0o755), busybox)
        for applet in sorted(APPLETS):
            _tar_add(tar, _symlink(f"bin/{applet}", "busybox"))
        # `sbin` and `usr/sbin` point at bin so absolute paths used elsewhere resolve.
        _tar_add(tar, _symlink("sbin", "bin"))
        _tar_add(tar, _symlink("usr/sbin", "../bin"))
        _tar_add(tar, _file("etc/passwd"), b"root:x:0:0:root:/root:/bin/sh\n")
        _tar_add(tar, _file("etc/group"), b"root:x:0:\n")
        for name, source in sorted(extra_files.items()):
            _tar_add(tar, _file(name.lstrip("/"), 0o755), source.read_bytes())
    return buf.getvalue()


def _config(layer: _Blob, arch: str, entrypoint: Sequence[str] | None, cmd: Sequence[str]) -> bytes:
    config: dict[str, object] = {"Cmd": list(cmd), "Env": [PATH_ENV], "WorkingDir": "/"}
    if entrypoint is not None:
        config["Entrypoint"] = list(entrypoint)
    return _canonical_json(
        {
            "architecture": arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": config,
            # An uncompressed layer's diff_id is its own digest.
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        }
    )


def _layout_tar(dest: Path, blobs: list[_Blob], index: bytes) -> None:
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, _file("oci-layout"), _canonical_json({"imageLayoutVersion": "1.0.0"}))
        _tar_add(tar, _file("index.json"), index)
        _tar_add(tar, _dir("blobs"))
        _tar_add(tar, _dir("blobs/sha256"))
        for blob in blobs:
            _tar_add(tar, _file("blobs/sha256/" + blob.digest.removeprefix("sha256:")), blob.data)
    tmp.replace(dest)  # atomic, so a half-written tar is never imported


def build_busybox_image(
    dest_tar: Path,
    name: str,
    *,
    extra_files: Mapping[str, Path] | None = None,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] = DEFAULT_CMD,
) -> Path:
    """Write an OCI image-layout tar for image ``name`` (a full reference) to ``dest_tar``.

    ``extra_files`` maps absolute paths in the image to host files added as
    executables (e.g. ``{"/agnhost": Path(...)}``); ``entrypoint`` and ``cmd`` go
    into the image config.

    ``name`` must be fully qualified (e.g. ``localhost/sluice-test/busybox:1``):
    ``ctr images import`` keeps such a ``org.opencontainers.image.ref.name`` as is,
    while a bare tag would get an ``import-<date>`` prefix. The tar is rebuilt only
    when missing, so a session-scoped caller pays for it once.
    """
    if dest_tar.exists():
        return dest_tar
    arch = _GOARCH.get(platform.machine(), platform.machine())
    layer = _Blob(MT_LAYER, _layer(BUSYBOX.read_bytes(), extra_files or {}))
    config = _Blob(MT_CONFIG, _config(layer, arch, entrypoint, cmd))
    manifest = _Blob(
        MT_MANIFEST,
        _canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": MT_MANIFEST,
                "config": config.descriptor(),
                "layers": [layer.descriptor()],
            }
        ),
    )
    annotations = {"org.opencontainers.image.ref.name": name, "io.containerd.image.name": name}
    index = _canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MT_INDEX,
            "manifests": [
                manifest.descriptor(
                    annotations=annotations, platform={"architecture": arch, "os": "linux"}
                )
            ],
        }
    )
    dest_tar.parent.mkdir(parents=True, exist_ok=True)
    _layout_tar(dest_tar, [layer, config, manifest], index)
    return dest_tar
