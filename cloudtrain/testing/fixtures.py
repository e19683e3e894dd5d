"""cloudtrain's pytest plugin (entry point ``pytest11``): the fixtures the conformance suite needs. Every pytest run
on a machine with cloudtrain installed imports this module, so its top imports pytest and the standard library
only; what a fixture needs is imported inside it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def stop_every_job(home: Path) -> None:
    """A failed test must not leave its local jobs running (they would hold ports and cores for the rest of the
    run)."""
    import signal

    from cloudtrain.home.procs import is_alive, kill_tagged
    from cloudtrain.providers.local.provider import LocalProvider

    if not (home / "jobs.db").exists():
        return
    for record in LocalProvider(home).db.list(1000):
        if record.state in ("pending", "running", "stopping"):
            if is_alive(record.supervisor_pid, record.supervisor_start):
                os.kill(record.supervisor_pid, signal.SIGKILL)  # type: ignore[arg-type]
            for node in record.nodes:
                kill_tagged(node.get("tag"))


def ddp_project(root: Path) -> Path:
    """``root/proj`` holding cloudtrain's reference DDP trainer (train_ddp.py), a project to plan and submit."""
    from cloudtrain.home.paths import resource_dir

    proj = root / "proj"
    proj.mkdir()
    (proj / "train_ddp.py").write_bytes((resource_dir("entrypoints") / "train_ddp.py").read_bytes())
    return proj


@pytest.fixture
def ct_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated cloudtrain home (job database, local store, logs) and profile for one test; local jobs still
    running at its end are stopped."""
    from cloudtrain import contract

    home = tmp_path / "ct-home"
    monkeypatch.setenv(contract.HOME, str(home))
    monkeypatch.setenv(contract.CONFIG, str(tmp_path / "ct-config.yaml"))  # a developer's profile stays out
    monkeypatch.delenv(contract.PROFILE, raising=False)
    yield home
    stop_every_job(home)


def pytest_configure(config: pytest.Config) -> None:
    # the suite marks its multi-process test slow (deselect with -m "not slow"); a plugin's own pytest knows the mark
    config.addinivalue_line("markers", "slow: takes several seconds (the suite's multi-process local job)")
