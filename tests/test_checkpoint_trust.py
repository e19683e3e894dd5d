"""A hostile or broken store: junk never blocks a restore, a restore never writes outside its folder, a checkpoint
found corrupt never counts for retention. On every backend (file://, moto S3, gcp-storage-emulator, Azurite)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import retention as checkpoint_retention
from cloudtrain.checkpoint import store as checkpoint_store
from tests.conftest import REPO

SHARD = "__0_0.distcp"


def _publish(root: str, tmp: Path, step: int, payload: bytes | None = None) -> None:
    folder = tmp / "local" / checkpoint_store.step_dir(step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SHARD).write_bytes(payload or f"shard-{step}".encode() * 100)
    files = checkpoint_store.describe_files(folder, [SHARD])
    remote = storage.join(root, checkpoint_store.step_dir(step))
    checkpoint_store.upload_files(folder, files, remote)
    checkpoint_store.publish(remote, step, files, world_size=1)


def _put(root: str, name: str, data: bytes) -> None:
    storage.store_for(root).write_bytes(f"{root.rstrip('/')}/{name}", data)


def _entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _manifest(step: int, *entries: dict) -> bytes:
    return json.dumps({"step": step, "kind": "full", "world_size": 1, "files": list(entries)}).encode()


def test_junk_in_the_store_never_blocks_a_restore(store_root: str, tmp_path: Path) -> None:
    """Issue 15.2: an unpadded step-5/ folder and manifests that are not manifests are skipped, one line each, without
    a traceback or a retry; the newest good checkpoint is restored and retention leaves it alone."""
    for step in (10, 20):
        _publish(store_root, tmp_path, step)
    data = b"state"
    _put(store_root, "step-5/state.pt", data)  # what a checkpoint URI equal to CLOUDTRAIN_CHECKPOINT_DIR leaves
    _put(store_root, "step-5/manifest.json", _manifest(5, _entry("state.pt", data)))
    junk = {
        30: b"[]",  # not an object
        40: json.dumps({"step": 40, "files": [{"path": "state.pt", "size": 5}]}).encode(),  # no sha256
        50: json.dumps({"step": "50", "files": "state.pt"}).encode(),  # wrong types
        60: json.dumps({"step": 60, "files": [{"path": "state.pt", "size": "5", "sha256": "0" * 64}]}).encode(),
        70: b"{not json",
        80: b"[" * 100_000,  # nested past the parser's recursion limit
        90: _manifest(60, _entry("state.pt", data)),  # another step's manifest
    }
    for step, body in junk.items():
        _put(store_root, f"{checkpoint_store.step_dir(step)}/state.pt", data)
        _put(store_root, f"{checkpoint_store.step_dir(step)}/manifest.json", body)

    messages: list[str] = []
    found = checkpoint_restore.restore_latest(store_root, tmp_path / "restore", log=messages.append)
    assert found is not None and found.step == 20
    assert not [m for m in messages if "retry" in m or "Traceback" in m], messages
    for step in junk:
        said = [m for m in messages if checkpoint_store.step_dir(step) in m]
        assert len(said) == 1 and "skipped" in said[0] and "\n" not in said[0], (step, said)
    assert [m for m in messages if "step-5 is not a checkpoint folder" in m]
    assert sorted(p.name for p in (tmp_path / "restore").iterdir()) == [checkpoint_store.step_dir(20)]

    # the junk is newer: may be somebody's in flight
    assert checkpoint_retention.apply_retention(store_root, keep=2) == []
    _publish(store_root, tmp_path, 100)
    assert checkpoint_retention.apply_retention(store_root, keep=2) == [10, *junk]  # older than the newest: removed
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [20, 100]
    assert storage.store_for(store_root).exists(f"{store_root}/step-5/state.pt")  # not cloudtrain's: never deleted


def test_restore_is_confined_to_its_folder(store_root: str, tmp_path: Path) -> None:
    """Issue 15.3: manifest entries that climb out ('../../../x'), absolute paths, and objects whose names do so
    under the step prefix make that checkpoint corrupt; nothing is written outside the restore folder."""
    scheme = store_root.split("://")[0]
    _publish(store_root, tmp_path, 10)
    data = b"written outside"
    outside = tmp_path / "outside" / "escape.bin"
    # absolute: the store holds 'step-N/' + '/abs/path' (object stores keep the double slash) and the object the
    # manifest's path joins to; on file:// the folder cannot hold such a name and the manifest alone remains
    absolute = checkpoint_store.step_dir(20)
    _put(store_root, f"{absolute}/{outside}", data)
    _put(store_root, f"{absolute}/{str(outside).lstrip('/')}", data)
    _put(store_root, f"{absolute}/manifest.json", _manifest(20, _entry(str(outside), data)))
    climbing = checkpoint_store.step_dir(30)
    if scheme == "s3":  # S3 keeps '..' in a key as it is
        _put(store_root, f"{climbing}/../../../escape.bin", data)
    if scheme == "az":  # Azure turns '\' into '/': the listing then names 'a/../../../escape.bin'
        _put(store_root, f"{climbing}/a\\..\\..\\..\\escape.bin", data)
    _put(store_root, f"{climbing}/manifest.json", _manifest(30, _entry("../../../escape.bin", data)))
    for step, path in ((40, "a/./b"), (50, "manifest.json"), (60, "")):
        _put(store_root, f"{checkpoint_store.step_dir(step)}/manifest.json", _manifest(step, _entry(path, data)))

    target = tmp_path / "a" / "b" / "restore"
    messages: list[str] = []
    found = checkpoint_restore.restore_latest(store_root, target, log=messages.append)
    assert not outside.exists()
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                     if p.is_file() and not p.is_relative_to(tmp_path / "local"))
    assert written == [f"a/b/restore/{checkpoint_store.step_dir(10)}/{name}" for name in (SHARD, "manifest.json")]
    assert found is not None and found.step == 10
    for step in (20, 30, 40, 50, 60):
        said = [m for m in messages if checkpoint_store.step_dir(step) in m]
        assert len(said) == 1 and ("corrupt" in said[0] or "unusable" in said[0]), (step, messages)


def _restore_in_another_process(root: str, target: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "cloudtrain.checkpoint", "restore", root, str(target)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "is corrupt" in done.stderr
    return dict(json.loads(done.stdout))


def _restored_step(root: str, target: Path) -> int | None:
    found = checkpoint_restore.restore_latest(root, target, log=lambda _m: None)
    return found.step if found else None


def test_retention_counts_only_checkpoints_that_verify(store_root: str, tmp_path: Path) -> None:
    """Issue 15.4: with keep=2 and a corrupt newest checkpoint, the restore (one process) marks it in the store, and
    retention after the next save (another process) keeps the newest checkpoint that verifies."""
    for step in (10, 20, 30):
        _publish(store_root, tmp_path, step)
    assert checkpoint_retention.apply_retention(store_root, keep=2) == [10]
    _put(store_root, f"{checkpoint_store.step_dir(30)}/{SHARD}", b"bit rot")
    assert _restore_in_another_process(store_root, tmp_path / "restore") == {"step": 20}
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [20]

    _publish(store_root, tmp_path, 25)  # the resumed job's next save
    assert checkpoint_retention.apply_retention(store_root, keep=2) == []
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [20, 25]
    assert _restored_step(store_root, tmp_path / "again") == 25

    # step 30 published again (the resumed job got there): it counts, and the marker of the old one goes
    _publish(store_root, tmp_path, 30)
    assert checkpoint_retention.apply_retention(store_root, keep=2) == [20]
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [25, 30]
    names = storage.store_for(store_root).list(storage.join(store_root, checkpoint_store.step_dir(30)))
    assert [n.rsplit("/", 1)[1] for n in names] == [SHARD, "manifest.json"]


def test_a_corrupt_checkpoint_older_than_the_newest_verified_one_is_removed(store_root: str, tmp_path: Path) -> None:
    for step in (10, 20):
        _publish(store_root, tmp_path, step)
    _put(store_root, f"{checkpoint_store.step_dir(20)}/{SHARD}", b"bit rot")
    assert _restored_step(store_root, tmp_path / "restore") == 10
    for step in (30, 40):
        _publish(store_root, tmp_path, step)
        checkpoint_retention.apply_retention(store_root, keep=2)
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [30, 40]
    assert sorted({u.split("/step-")[1].split("/")[0] for u in storage.store_for(store_root).list(store_root)}) == \
        ["000000030", "000000040"]


def test_folder_markers_are_neither_files_nor_corruption(store_root: str, tmp_path: Path) -> None:
    """Zero-byte 'folder/' objects (an S3 console's "Create folder", FUSE mounts) under a checkpoint or an output
    location are folders, not files: a checkpoint holding one still restores, and `outputs --download` skips them."""
    if store_root.startswith("file://"):
        pytest.skip("a file system has real folders, not marker objects")
    from cloudtrain.jobs import outputs

    _publish(store_root, tmp_path, 10)
    _put(store_root, f"{checkpoint_store.step_dir(10)}/", b"")
    _put(store_root, f"{checkpoint_store.step_dir(10)}/extra/", b"")
    assert _restored_step(store_root, tmp_path / "restore") == 10

    out = storage.join(store_root, "out")
    for name, data in (("logs/", b""), ("logs/node-0/stdout.log", b"hello"), ("model.pt", b"weights")):
        _put(out, name, data)
    fetched = outputs.download(out, tmp_path / "download", show_progress=False)
    assert sorted(f.name for f in fetched) == ["logs/node-0/stdout.log", "model.pt"]
    assert (tmp_path / "download" / "logs" / "node-0" / "stdout.log").read_bytes() == b"hello"


def test_a_job_that_restored_nothing_it_could_use_says_so_in_its_status(tmp_path: Path) -> None:
    """Issue 37's rule: every checkpoint in the store fails verification (here: a file of it changed in the store),
    so the job trains from scratch. Before: the node logged it, and the job read a plain `succeeded`. Now its status
    line says nothing could be restored and the run started from scratch, without the resume arguments."""
    from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
    from tests.conftest import cli_env

    store = tmp_path / "store"
    folder = tmp_path / "proj" / "ckpt"
    folder.mkdir(parents=True)
    snapshots = checkpoint_snapshots.Snapshotter(folder, store.as_uri(), keep=2, quiet=0.0)
    (folder / "state.pt").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: whole by its format
    assert snapshots.poll(final=True) == 1
    (next(store.rglob("state.pt"))).write_bytes(b"changed in the store")
    (tmp_path / "proj" / "train.py").write_text("import sys; print('args', sys.argv[1:])\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=tmp_path / "proj", text=True,
                              capture_output=True, env=cli_env(tmp_path / "home"), timeout=300)

    run = cli("submit", "train.py", "--checkpoint-uri", store.as_uri(), "--checkpoint-dir", "ckpt",
              "--resume-arg=--resume")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "args []" in run.stdout, run.stdout[-2000:]  # no resume arguments without a checkpoint
    handle = json.loads(cli("list", "-o", "json").stdout)[0]["handle"]
    status = json.loads(cli("status", handle, "-o", "json").stdout)
    assert status["state"] == "succeeded"
    assert "could be restored" in status["message"] and "from scratch" in status["message"], status["message"]
