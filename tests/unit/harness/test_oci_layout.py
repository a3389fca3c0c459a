"""docker save's archive format turned into an OCI image layout."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.harness import oci_layout


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _docker_archive(path: Path, layers: list[bytes], diff_ids: list[str] | None = None) -> bytes:
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["sluicectl"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids or [_digest(x) for x in layers]},
        }
    ).encode()
    members = {f"{_digest(config)[7:]}.json": config}
    names = []
    for i, layer in enumerate(layers):
        members[f"layer{i}/layer.tar"] = layer
        names.append(f"layer{i}/layer.tar")
    manifest = [{"Config": f"{_digest(config)[7:]}.json", "RepoTags": ["x:1"], "Layers": names}]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return config


def test_the_layout_holds_the_same_config_and_layers_under_their_digests(tmp_path: Path) -> None:
    layers = [_layer({"bin/a": b"a"}), _layer({"etc/b": b"bb"}), _layer({"bin/a": b"a"})]
    config = _docker_archive(tmp_path / "image.tar", layers)
    oci_layout.docker_archive_to_oci(tmp_path / "image.tar", tmp_path / "oci.tar", "localhost/x:1")
    with tarfile.open(tmp_path / "oci.tar") as tar:
        blobs = {
            m.name.rsplit("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and m.name.startswith("blobs/sha256/")
        }
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}  # type: ignore[arg-type]
    for digest, data in blobs.items():
        assert hashlib.sha256(data).hexdigest() == digest
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x:1"
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(blobs[entry["digest"][7:]])
    assert blobs[manifest["config"]["digest"][7:]] == config
    assert [layer["digest"] for layer in manifest["layers"]] == [_digest(x) for x in layers]
    assert len(blobs) == 2 + 2  # manifest, config, two distinct layers


def test_a_layer_that_does_not_match_its_diff_id_is_refused(tmp_path: Path) -> None:
    layer = _layer({"bin/a": b"a"})
    _docker_archive(tmp_path / "image.tar", [layer], diff_ids=["sha256:" + "0" * 64])
    with pytest.raises(ValueError, match="does not match"):
        oci_layout.docker_archive_to_oci(tmp_path / "image.tar", tmp_path / "oci.tar", "x")
