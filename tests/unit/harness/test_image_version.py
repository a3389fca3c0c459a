"""One version: cni/plugin/release.py's; sluicectl --version prints it, the image has it."""

from __future__ import annotations

import importlib.metadata
import re

from click.testing import CliRunner

from cni.cli import cli
from tests.harness import sluice_image


def test_sluicectl_version_is_the_releases() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"sluicectl {sluice_image.version()}"
    assert importlib.metadata.version("sluice") == sluice_image.version()


def test_the_image_is_tagged_and_labelled_with_it() -> None:
    assert sluice_image.image_name() == f"localhost/sluice:{sluice_image.version()}"
    dockerfile = (sluice_image.REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r'org\.opencontainers\.image\.version="\$\{VERSION\}"', dockerfile)
    # ... and the build refuses an installed version other than the label's.
    assert 'test "$(sluicectl --version)" = "sluicectl $VERSION"' in dockerfile
