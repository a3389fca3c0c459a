"""Turn ``docker save`` output into an OCI image-layout tar.

Debian's Docker 20.10 saves images in its own archive format (``manifest.json``,
a config file and one uncompressed ``layer.tar`` per layer). An OCI layout
holds the same bytes under content addresses: the config as is, each layer tar
as a blob whose digest is its diff id, a manifest, and an ``index.json`` naming
the image, so ``ctr images import`` (and any OCI tool) loads it with the name
given here. Layers are streamed, never held in memory, and each is checked
against the diff id its config declares.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import IO

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 1 << 20


class _HashingReader:
    """Reads through a file object while hashing what it reads."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source = source
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.sha.update(data)
        return data


def _json_bytes(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))


def _add_dir(out: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    out.addfile(info)


def docker_archive_to_oci(archive: Path, dest: Path, name: str) -> dict[str, object]:
    """Write ``dest`` (an OCI layout tar) for the single image in ``archive``.

    ``name`` is the full reference recorded for ``ctr images import``
    (``localhost/sluice:0.1.0``). Returns the manifest's descriptor.
    """
    with tarfile.open(archive) as src:
        manifests = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
        if len(manifests) != 1:
            raise ValueError(f"{archive} holds {len(manifests)} images, expected one")
        entry = manifests[0]
        config_bytes = src.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        config = json.loads(config_bytes)
        diff_ids = config["rootfs"]["diff_ids"]
        if len(diff_ids) != len(entry["Layers"]):
            raise ValueError(
                f"{archive}: {len(entry['Layers'])} layers but {len(diff_ids)} diff ids"
            )
        partial = dest.with_name(dest.name + ".part")
        layers = []
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as out:
            _add(out, "oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
            _add_dir(out, "blobs")
            _add_dir(out, "blobs/sha256")
            written: set[str] = set()
            for member_name, diff_id in zip(entry["Layers"], diff_ids, strict=True):
                member = src.getmember(member_name)
                layers.append({"mediaType": MT_LAYER, "digest": diff_id, "size": member.size})
                if diff_id in written:
                    continue
                reader = _HashingReader(src.extractfile(member))  # type: ignore[arg-type]
                info = tarfile.TarInfo("blobs/sha256/" + diff_id.removeprefix("sha256:"))
                info.size = member.size
                info.mode = 0o644
                out.addfile(info, reader)  # type: ignore[arg-type]
                if "sha256:" + reader.sha.hexdigest() != diff_id:
                    raise ValueError(f"{archive}: {member_name} does not match {diff_id}")
                written.add(diff_id)
            config_desc = {
                "mediaType": MT_CONFIG,
                "digest": _digest(config_bytes),
                "size": len(config_bytes),
            }
            manifest = _json_bytes(
                {
                    "schemaVersion": 2,
                    "mediaType": MT_MANIFEST,
                    "config": config_desc,
                    "layers": layers,
                }
            )
            _add(out, "blobs/sha256/" + config_desc["digest"].removeprefix("sha256:"), config_bytes)
            _add(out, "blobs/sha256/" + _digest(manifest).removeprefix("sha256:"), manifest)
            manifest_desc: dict[str, object] = {
                "mediaType": MT_MANIFEST,
                "digest": _digest(manifest),
                "size": len(manifest),
                "platform": {"architecture": config["architecture"], "os": config["os"]},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name,
                },
            }
            index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [manifest_desc]}
            _add(out, "index.json", _json_bytes(index))
        partial.replace(dest)
        return manifest_desc


def name_and_digest(oci_tar: Path) -> tuple[str, str]:
    """The image name an OCI tar's index gives its one manifest, and that manifest's
    digest (what a reference by digest names)."""
    with tarfile.open(oci_tar) as archive:
        member = archive.extractfile("index.json")
        if member is None:
            raise ValueError(f"{oci_tar} has no index.json")
        (manifest,) = json.load(member)["manifests"]
    return str(manifest["annotations"]["io.containerd.image.name"]), str(manifest["digest"])


def repository(name: str) -> str:
    """``registry/path`` of ``registry/path:tag`` or ``registry/path@digest``."""
    name = name.split("@", 1)[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    return name[:colon] if colon > slash else name
