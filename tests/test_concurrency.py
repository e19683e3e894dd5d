"""Many CLI processes on one job database at once: nothing corrupts, nothing fails, a retried submit is one job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cloudtrain import Job
from cloudtrain.handles import JobHandle
from cloudtrain.providers.local.jobdb import JobDB
from cloudtrain.providers.local.provider import LocalProvider
from tests.conftest import REPO, SCRIPTS, cli_env

pytestmark = pytest.mark.slow


def test_processes_opening_a_new_database_at_once_all_get_in(tmp_path: Path) -> None:
    """The first submits on a machine race to put the new job database in WAL mode; SQLite answered the losers
    "database is locked" at once (3 rounds in 60 here), and that submit failed."""
    errors: list[BaseException] = []

    def open_db(path: Path) -> None:
        try:
            JobDB(path).list()
        except BaseException as exc:
            errors.append(exc)

    for round_ in range(150):
        threads = [threading.Thread(target=open_db, args=(tmp_path / f"db-{round_}" / "jobs.db",)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_the_same_plan_submitted_concurrently_is_one_job(ct_home: Path, tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "fails.py").write_text((SCRIPTS / "fails.py").read_text())
    plan = Job(script="fails.py", source_dir=str(tmp_path / "proj")).plan("local")
    handles, errors = [], []

    def submit() -> None:
        try:
            handles.append(LocalProvider(ct_home).submit(plan))  # e.g. a submit retried after a timeout
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(handles)) == 1
    provider = LocalProvider(ct_home)
    assert [str(s.handle) for s in provider.list()].count(str(handles[0])) == 1
    provider.wait(handles[0], timeout=120, poll=0.5)
    plan.package.close()


def test_concurrent_cli_processes_share_the_database(ct_home: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "plain_torchrun.py").write_text((REPO / "entrypoints" / "plain_torchrun.py").read_text())
    env = cli_env(ct_home)

    def cli(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    submits = [cli("submit", str(proj / "plain_torchrun.py"), "--detach") for _ in range(4)]
    handles = []
    for proc in submits:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        handles.append(out.strip())
    readers = [cli("status", h, "-o", "json") for h in handles for _ in range(3)] + [cli("list", "-o", "json")
                                                                                     for _ in range(6)]
    for proc in readers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        json.loads(out)
    listed = json.loads(subprocess.run([sys.executable, "-m", "cloudtrain", "list", "-o", "json"], env=env,
                                       capture_output=True, text=True, timeout=60).stdout)
    assert sorted(j["handle"] for j in listed) == sorted(handles)
    provider = LocalProvider(ct_home)
    for handle in handles:
        status = provider.wait(JobHandle.parse(handle), timeout=180, poll=0.5)
        assert status.state.value == "succeeded", (status, "\n".join(provider.logs(JobHandle.parse(handle))))
