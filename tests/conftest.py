from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloudtrain.testing.fixtures import ddp_project, stop_every_job  # shipped for plugins' tests too

REPO = Path(__file__).resolve().parents[1]

# A developer's own ~/.config/cloudtrain profile must not leak into what the tests plan (subprocesses inherit this).
os.environ["CLOUDTRAIN_CONFIG"] = str(Path(tempfile.mkdtemp(prefix="ct-config-")) / "config.yaml")
os.environ.pop("CLOUDTRAIN_PROFILE", None)
# Plugins installed on this machine stay out of cloudtrain's own tests (tests/plugins.py lets a test's own back in).
os.environ["CLOUDTRAIN_PLUGINS"] = "none"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def ct_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated cloudtrain home (job database, local store, logs) for one test."""
    home = tmp_path / "ct-home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    yield home
    stop_every_job(home)


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["CLOUDTRAIN_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def cli(ct_home: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``cloudtrain`` as a separate process, the way a user does."""

    def run(*args: str, cwd: Path | None = None, timeout: float = 240,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {**cli_env(ct_home), **(env_extra or {})}
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd or tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return ddp_project(tmp_path)


def wait_for(predicate: Callable[[], bool], timeout: float = 60, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def status_json(cli: Callable[..., subprocess.CompletedProcess[str]], handle: str) -> dict:
    out = cli("status", handle, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


from tests.emulators import emulators, ensure, root_uri  # noqa: E402,F401 - fixtures
from tests.faulty import faulty  # noqa: E402,F401 - fixture

BACKENDS = ["file", "s3", "gs", "az"]


@pytest.fixture(params=BACKENDS)
def store_root(request: pytest.FixtureRequest, emulators, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    """A fresh prefix on each storage backend: file://, S3 (moto), GCS (gcp-storage-emulator), Azure (Azurite)."""
    tmp = tmp_path_factory.getbasetemp()
    ensure(request.param, emulators, tmp)
    return root_uri(request.param, tmp)
