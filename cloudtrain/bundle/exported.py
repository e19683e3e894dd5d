"""What every ``plan --export`` folder holds besides the platform's own files: the node's files (bootstrap, bundle,
manifest) and a README saying how to run it. Used by each provider's ``export.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.bundle.packaging import BOOTSTRAP_NAME, BUNDLE_NAME

if TYPE_CHECKING:
    from cloudtrain.bundle.packaging import Package


def bundle_files(package: Package, folder: Path) -> list[Path]:
    """What a node needs: bootstrap.py, bundle.tar.gz and manifest.json (staged last: it marks the prefix whole)."""
    folder.mkdir()
    shutil.copyfile(package.bootstrap, folder / BOOTSTRAP_NAME)
    shutil.copyfile(package.path, folder / BUNDLE_NAME)
    (folder / "manifest.json").write_text(json.dumps(package.manifest(), indent=1))
    return [folder / BOOTSTRAP_NAME, folder / BUNDLE_NAME, folder / "manifest.json"]


def readme(folder: Path, title: str, command: str, details: list[str]) -> Path:
    """The README of an exported job: how to run it, in that folder."""
    text = "\n".join([f"# {title}", "", "Run, in this folder:", "", "```bash", command, "```", "", *details, ""])
    (folder / "README.md").write_text(text)
    return folder / "README.md"
