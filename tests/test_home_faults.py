"""cloudtrain's own home (``CLOUDTRAIN_HOME``) when it fails: a read-only folder, a full disk (while bundling, while
staging, during a job), a corrupt or locked job database. Real conditions: small or read-only tmpfs mounts (root,
as in CI), a file of garbage, a second process holding the database's write lock. Each says what happened, where,
and the fix, exits 2, prints no traceback and records nothing half-way."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import cli_env, stop_every_job

pytestmark = pytest.mark.slow

_FILL = """
print("filling", flush=True)
try:
    with open("ballast.bin", "wb") as f:
        while True:
            f.write(bytes(65536))
            f.flush()
except OSError as exc:
    print("stopped:", exc, flush=True)
"""


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a tmpfs of a given size (read-only on request) under tmp_path; unmounted after the test."""
    mounted: list[Path] = []

    def mount(name: str, size: str, read_only: bool = False) -> Path:
        where = tmp_path / name
        where.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            if os.environ.get("CI") == "true":  # CI runs as root: the mount must work there
                pytest.fail(f"cannot mount a tmpfs: {done.stderr.strip()}")
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def cloudtrain(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, env=cli_env(home),
                          capture_output=True, text=True, timeout=240)


def refused(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """One message, exit 2, no traceback; returns stderr."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "fix:" in result.stderr, result.stderr
    return result.stderr


def job_rows(home: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(home / "jobs.db") as conn:
        return conn.execute("SELECT id, state FROM jobs").fetchall()


def no_job_folders(home: Path) -> bool:
    return not (home / "jobs").exists() or not any((home / "jobs").iterdir())


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "fill.py").write_text(_FILL)
    return folder


def test_a_read_only_home(tmpfs: Callable[..., Path], proj: Path) -> None:
    home = tmpfs("home", "4m", read_only=True)
    for args in (["submit", "train.py", "--detach"], ["list"]):
        message = refused(cloudtrain(home, *args, cwd=proj), str(home), "read-only", "CLOUDTRAIN_HOME")
        assert "cannot package" not in message, "the project folder is not at fault"
    assert list(home.iterdir()) == []


def test_a_home_made_read_only_after_jobs_ran(tmpfs: Callable[..., Path], proj: Path) -> None:
    home = tmpfs("home", "4m")
    assert cloudtrain(home, "list", cwd=proj).returncode == 0  # the job database exists
    remount_read_only(home)
    for args in (["list"], ["status", "local://nosuch-20260101-000000-abcd"], ["submit", "train.py", "--detach"]):
        refused(cloudtrain(home, *args, cwd=proj), str(home), "read-only")


def test_a_full_disk_while_bundling(tmpfs: Callable[..., Path], proj: Path) -> None:
    home = tmpfs("home", "64k")
    refused(cloudtrain(home, "submit", "train.py", "--detach", cwd=proj), str(home), "no space left",
            "CLOUDTRAIN_HOME")
    assert not (home / "jobs.db").exists() or job_rows(home) == []


def _bundle_bytes(proj: Path, tmp_path: Path) -> int:
    plan = cloudtrain(tmp_path / "measure-home", "plan", "train.py", "-o", "json", cwd=proj)
    assert plan.returncode == 0, plan.stderr
    return int(json.loads(plan.stdout)["package"]["bundle_bytes"])


def test_a_full_disk_while_staging_leaves_no_job_and_no_partial_bundle(tmpfs: Callable[..., Path], proj: Path,
                                                                        tmp_path: Path) -> None:
    size = _bundle_bytes(proj, tmp_path) * 3 // 2  # room to build the bundle, not to stage a second copy
    home = tmpfs("home", str(size))
    message = refused(cloudtrain(home, "submit", "train.py", "--detach", cwd=proj), "no space left",
                      str(home / "store"))
    assert "cannot package" not in message
    assert job_rows(home) == [], "no pending job"
    store = home / "store"
    assert not list(store.rglob("*.part")) and not list(store.rglob("manifest.json")), "no partial bundle"
    assert no_job_folders(home)


@pytest.mark.parametrize("damage", ["garbage", "torn"])
def test_a_corrupt_job_database_is_set_aside_with_a_note(tmp_path: Path, proj: Path, damage: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if damage == "garbage":
        (home / "jobs.db").write_bytes(os.urandom(20000))
    else:  # a real database whose pages after the first were overwritten (a bad disk, a copy cut short)
        assert cloudtrain(home, "list", cwd=proj).returncode == 0
        with open(home / "jobs.db", "r+b") as db:
            db.seek(4096)
            db.write(b"\xff" * (os.fstat(db.fileno()).st_size - 4096))
    before = (home / "jobs.db").read_bytes()
    result = cloudtrain(home, "list", cwd=proj)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    aside = list(home.glob("jobs.db.corrupt-*"))
    assert len([p for p in aside if not p.name.endswith(("-wal", "-shm"))]) == 1, aside
    kept = next(p for p in aside if not p.name.endswith(("-wal", "-shm")))
    assert kept.read_bytes() == before, "the old database is kept as it was"
    assert str(kept) in result.stderr and "set aside" in result.stderr and "new" in result.stderr
    missing = cloudtrain(home, "status", "local://gone-20260101-000000-abcd", cwd=proj)
    assert missing.returncode == 2 and str(kept) in missing.stderr, missing.stderr  # where an old job may be
    submitted = cloudtrain(home, "submit", "train.py", "--detach", cwd=proj)
    assert submitted.returncode == 0, submitted.stderr
    assert "set aside" not in submitted.stderr, "said once"
    stop_every_job(home)


_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_locked_job_database_waits_a_stated_time(ct_home: Path, proj: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from cloudtrain.cli.main import main
    from cloudtrain.providers.local import jobdb

    jobdb.JobDB(ct_home / "jobs.db").list()
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(ct_home / "jobs.db")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        monkeypatch.setattr(jobdb, "BUSY_SECONDS", 2)
        monkeypatch.chdir(proj)
        started = time.monotonic()
        code = main(["submit", "train.py", "--detach"])
        waited = time.monotonic() - started
    finally:
        locker.communicate("", timeout=30)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and str(ct_home / "jobs.db") in err and "locked" in err and "2 s" in err, err
    assert 2 <= waited < 30
    assert job_rows(ct_home) == [], "no job recorded"
    assert no_job_folders(ct_home)


def test_a_disk_that_fills_during_a_job_is_said_in_its_status(tmpfs: Callable[..., Path], proj: Path) -> None:
    """The script fills the home's disk. The supervisor lives on and records the end (a reserve it gave up made
    room), a foreground submit follows to the end, and status on the still-full disk says what happened."""
    home = tmpfs("home", "16m")
    try:
        followed = cloudtrain(home, "submit", "fill.py", cwd=proj)
        ours = [line for line in followed.stderr.splitlines() if not line.startswith("[node")]
        assert not any("Traceback" in line for line in ours), followed.stderr
        assert followed.returncode == 1 and "filled up during the job" in followed.stderr, followed.stderr
        assert not list(home.glob("jobs/*/.space-reserve")), "the reserve is given back"
        handle = next(line.split()[1] for line in ours if line.startswith("submitted "))
        result = cloudtrain(home, "status", handle, "-o", "json", cwd=proj)  # the disk is still full
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["state"] in ("failed", "succeeded"), status
        assert f"the disk holding {home} filled up" in status["message"], status["message"]
    finally:
        for ballast in home.glob("jobs/*/node-0/ballast.bin"):
            ballast.unlink()
        stop_every_job(home)


def test_a_supervisor_outlasts_a_lock_held_past_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's writes while another process holds the lock longer than the wait: queued, the job goes on,
    and made in order once the lock is released (before: the supervisor died on sqlite3.OperationalError)."""
    from cloudtrain.providers.local import jobdb
    from cloudtrain.providers.local.jobdb import JobRecord
    from cloudtrain.providers.local.steady_db import SteadyDB

    path = tmp_path / "jobs.db"
    db = SteadyDB(path)
    db.insert(JobRecord(id="j", name="j", state="running", job_dir=str(tmp_path)))
    monkeypatch.setattr(jobdb, "BUSY_SECONDS", 1)
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        assert db.update("j", message="node 0 exited") is True
        assert db.update("j", state="succeeded", message="", ended_at=1.0, only_if_state=("running",)) is True
        assert len(db.queued) == 2
    finally:
        locker.communicate("", timeout=30)
    db.settle()
    record = db.get("j")
    assert db.queued == [] and record is not None and (record.state, record.ended_at) == ("succeeded", 1.0)


# -- issue 38.18: the job's own checkpoints fill the disk the node writes its files to -------------------------------

_FILL_CHECKPOINTS = """
import os
print("token is", os.environ["HF_TOKEN"], flush=True)  # in the worker's log, before the disk is full
folder = os.path.join(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"], "step-000000001")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "model.bin"), "wb", buffering=0) as out:
    for size in (1 << 16, 1 << 12, 1):  # to the last byte the disk holds
        try:
            while True:
                out.write(bytes(size))
        except OSError:
            pass
"""
_TOKEN = "hf_" + "k3y" * 10


def test_checkpoints_that_fill_the_disk_fail_the_node_with_the_folder_and_the_fix(tmpfs: Callable[..., Path],
                                                                                   proj: Path) -> None:
    """The script's checkpoints fill the home's disk to the last byte, then it exits 0. The node's bootstrap crashed
    masking its workers' logs and writing its status file (a traceback in the node's log); now the status goes into
    the room held for it from the node's start, the job fails with one line naming the folder and the fix, and the
    workers' logs are still masked (in place: there is no room for a masked copy)."""
    home = tmpfs("home", "16m")
    (proj / "fillck.py").write_text(_FILL_CHECKPOINTS)
    try:
        followed = cloudtrain(home, "submit", "fillck.py", "--env", f"HF_TOKEN={_TOKEN}", cwd=proj)
        assert followed.returncode == 1 and "Traceback" not in followed.stderr, followed.stderr
        handle = next(line.split()[1] for line in followed.stderr.splitlines() if line.startswith("submitted "))
        job_dir = home / "jobs" / handle.split("://")[1]
        said = (f"cannot write the node's status file: no space left on the disk holding {job_dir}: free space there, "
                "move the job's working folder to a disk with room (a local job: CLOUDTRAIN_HOME), or keep fewer "
                "checkpoints (checkpoint.keep)")
        assert f"node 0 failed with exit code 1: {said}" in followed.stderr  # (the node's log itself has no room)
        status = json.loads(cloudtrain(home, "status", handle, "-o", "json", cwd=proj).stdout)
        assert status["state"] == "failed" and f"node 0 failed with exit code 1: {said}" in status["message"], status
        node = json.loads((job_dir / "node-0.status.json").read_text())
        assert node["outcome"] == "failed" and node["reason"] == said, node
        logs = [p for p in (job_dir / "node-0" / "worker-logs").rglob("*") if p.is_file()]
        assert logs and not any(_TOKEN in p.read_text(errors="replace") for p in logs)
        assert any("token is ****" in p.read_text(errors="replace") for p in logs)
        assert not list(job_dir.rglob("*.masking")) and not list(job_dir.rglob("*.tmp")), "nothing half-written"
        assert not list(job_dir.glob("*.room")), "the room held for the status file became the status file"
        copied = next(w for w in status["nodes"][0]["warnings"] if w.startswith("copying logs"))
        assert "stdout.log failed: no space left on the disk" in copied and "attempts" not in copied, copied
    finally:
        for ballast in home.glob("jobs/*/node-0/checkpoints/step-*/model.bin"):
            ballast.unlink()
        stop_every_job(home)


def _run_bootstrap(tmp_path: Path, workdir: Path, status: Path, script: str = "print('trained', flush=True)\n",
                   **env: str) -> subprocess.CompletedProcess[str]:
    from tests.node_support import REPO, make_bundle, node_env

    bundle = make_bundle(tmp_path, script)
    return subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle", str(bundle),
                           "--workdir", str(workdir), "--script", "train.py", "--nproc-per-node", "1",
                           "--status-file", str(status)], env=node_env(tmp_path, **env), capture_output=True,
                          text=True, timeout=240)


def _fill(folder: Path) -> None:
    with open(folder / "ballast.bin", "wb", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    out.write(bytes(size))
            except OSError:
                pass


def test_a_bundle_unpacked_onto_a_full_disk_blames_the_disk_not_the_bundle(tmpfs: Callable[..., Path],
                                                                              tmp_path: Path) -> None:
    """A node (a restart) whose working folder's disk is full: the bundle was said to be 'truncated, corrupt or not a
    gzip tar; stage it again', which changes nothing. The disk is named, with the fix."""
    disk = tmpfs("work", "1m")
    _fill(disk)
    result = _run_bootstrap(tmp_path, disk / "node", tmp_path / "status.json")
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert (f"error: cannot unpack the bundle: no space left on the disk holding {disk / 'node' / 'bundle'}: free "
            "space there") in result.stdout, result.stdout
    assert "corrupt" not in result.stdout
    assert "no space left" in json.loads((tmp_path / "status.json").read_text())["error"]


def test_a_status_file_on_a_full_disk_fails_the_node_in_one_line(tmpfs: Callable[..., Path], tmp_path: Path) -> None:
    """The status file's own disk full from the node's start (no room could be held for it): the script trains, the
    node cannot record how it ended, and says so, failing, instead of a traceback from writing the file."""
    disk = tmpfs("status", "1m")
    _fill(disk)
    result = _run_bootstrap(tmp_path, tmp_path / "work", disk / "node-0.status.json")
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out and "trained" in out, out
    assert (f"node 0: cannot write the node's status file: no space left on the disk holding {disk}: free space "
            "there") in result.stdout, result.stdout
    assert "node 0 failed (torchrun exit 0)" in result.stdout
    assert sorted(p.name for p in disk.iterdir()) == ["ballast.bin"], "nothing half-written"


def test_a_checkpoint_published_from_a_full_disk_stands(tmpfs: Callable[..., Path], tmp_path: Path) -> None:
    """The script's step folder fills the node's disk; the store (elsewhere) has room. The folder is published whole,
    and only the node's own note of that (its manifest.json) finds no room: that is a warning, not 'the final
    checkpoint sync failed' failing a job whose checkpoint is in the store."""
    disk, store = tmpfs("work", "4m"), tmp_path / "store"
    result = _run_bootstrap(tmp_path, disk / "node", tmp_path / "status.json", _FILL_CHECKPOINTS,
                            HF_TOKEN=_TOKEN, CLOUDTRAIN_CHECKPOINT_URI=store.as_uri())
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in out, out
    assert "warning: published " in out and "but cannot note it in" in out and "checkpoint.keep" in out, out
    assert json.loads((tmp_path / "status.json").read_text())["outcome"] == "succeeded"
    assert not (tmp_path / "status.json.room").exists(), "the room held for the status file is given back"
    written = disk / "node" / "checkpoints" / "step-000000001" / "model.bin"
    assert written.stat().st_size > 1024 * 1024, "the script filled the disk"
    assert (store / "step-000000001" / "model.bin").stat().st_size == written.stat().st_size
    assert (store / "step-000000001" / "manifest.json").is_file()
