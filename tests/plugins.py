"""Plugins installed the way pip installs them, for cloudtrain's own tests: a ``.dist-info`` folder (with its
``entry_points.txt``) on sys.path beside the plugin's code (tests/plugin/). cloudtrain's suite hides plugins installed
on the machine (``CLOUDTRAIN_PLUGINS=none``, tests/conftest.py); ``install`` lets the ones a test names back in."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PLUGIN = Path(__file__).resolve().parent / "plugin"


def install(site: Path, distribution: str, entries: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """``distribution`` installed into ``site`` (on sys.path, and on PYTHONPATH for subprocesses) with these
    ``cloudtrain.providers`` entry points; its code is under tests/plugin/."""
    dist = site / f"{distribution}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cloudtrain.providers]\n"
                                           + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    if str(site) not in sys.path:
        monkeypatch.syspath_prepend(str(PLUGIN))
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), str(PLUGIN), str(REPO),
                                                                      os.environ.get("PYTHONPATH")])))
    shown = {n for n in os.environ.get("CLOUDTRAIN_PLUGINS", "").split(",") if n and n != "none"}
    monkeypatch.setenv("CLOUDTRAIN_PLUGINS", ",".join(sorted(shown | set(entries))))
    return site


def forget(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        del sys.modules[name]


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """toyprov installed as a distribution is. Subprocesses (the CLI, the toy's runner, local nodes) see it too."""
    yield install(tmp_path / "site", "toyprov", {"toy": "toyprov:PROVIDER"}, monkeypatch)
    forget("toyprov")


@pytest.fixture
def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """brokenprov installed: its import raises."""
    yield install(tmp_path / "site", "brokenprov", {"broken": "brokenprov:PROVIDER"}, monkeypatch)
    forget("brokenprov")
