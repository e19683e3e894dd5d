"""One conformance suite for every storage backend, and the checkpoint protocol on each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain import contract, storage
from cloudtrain.node import checkpoint_store


def test_object_operations(store_root: str, tmp_path: Path) -> None:
    store = storage.store_for(store_root)
    uri = storage.join(store_root, "a", "b.txt")
    assert not store.exists(uri)
    store.write_bytes(uri, b"hello")
    assert store.exists(uri) and store.read_bytes(uri) == b"hello"
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 40_000)  # 10 MB
    sent: list[int] = []  # staging's progress bar: every byte reported once (from other threads on S3)
    assert store.put_file(source, storage.join(store_root, "c", "big.bin"), sent.append) == source.stat().st_size
    assert sum(sent) == source.stat().st_size
    store.get_file(storage.join(store_root, "c", "big.bin"), tmp_path / "copy.bin")
    assert (tmp_path / "copy.bin").read_bytes() == source.read_bytes()
    assert store.list(store_root) == sorted([uri, storage.join(store_root, "c", "big.bin")])
    assert store.list(storage.join(store_root, "a")) == [uri]
    store.delete([uri, storage.join(store_root, "never-existed")])
    assert not store.exists(uri)
    assert store.list(storage.join(store_root, "a")) == []


def _write_checkpoint(root: Path, store_root: str, step: int, publish: bool = True) -> list[dict]:
    folder = root / checkpoint_store.step_dir(step)
    (folder / "extra").mkdir(parents=True, exist_ok=True)
    (folder / "__0_0.distcp").write_bytes(f"shard-{step}".encode() * 100)
    (folder / "extra" / "rank-0.pt").write_bytes(b"rng")
    files = checkpoint_store.describe_files(folder, ["__0_0.distcp", "extra/rank-0.pt"])
    remote = storage.join(store_root, checkpoint_store.step_dir(step))
    checkpoint_store.upload_files(folder, files, remote)
    if publish:
        checkpoint_store.publish(remote, step, files, world_size=1)
    return files


def test_manifest_last_retention_and_fallback(store_root: str, tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _write_checkpoint(tmp_path / "local", store_root, step)
    _write_checkpoint(tmp_path / "local", store_root, 40, publish=False)  # an upload cut off before its manifest
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [10, 20, 30]

    removed = checkpoint_store.apply_retention(store_root, keep=2)
    assert removed == [10]
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [20, 30]
    # the partial step 40 is newer than the newest complete one: left alone, it may still be in flight
    assert any("step-000000040" in u for u in storage.store_for(store_root).list(store_root))

    # corrupt the newest complete checkpoint: restore says so and falls back to the previous one
    store = storage.store_for(store_root)
    store.write_bytes(storage.join(store_root, checkpoint_store.step_dir(30), "__0_0.distcp"), b"bit rot")
    messages: list[str] = []
    found = checkpoint_store.restore_latest(store_root, tmp_path / "restore", log=messages.append)
    assert found is not None and found.step == 20
    assert any("corrupt" in m and "falling back" in m for m in messages)
    restored = tmp_path / "restore" / checkpoint_store.step_dir(20)
    assert (restored / "__0_0.distcp").read_bytes() == b"shard-20" * 100
    assert json.loads((restored / checkpoint_store.MANIFEST).read_text())["step"] == 20
    assert not (tmp_path / "restore" / checkpoint_store.step_dir(30)).exists()


def test_retention_never_deletes_the_last_complete(store_root: str, tmp_path: Path) -> None:
    _write_checkpoint(tmp_path / "local", store_root, 5)
    assert checkpoint_store.apply_retention(store_root, keep=1) == []
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [5]


def test_plain_script_sync_publishes_complete_folders_and_leaves_runtime_dirs_alone(tmp_path: Path) -> None:
    remote = (tmp_path / "bucket").as_uri()
    plain = tmp_path / "plain"
    for step in (1, 2):
        (plain / checkpoint_store.step_dir(step)).mkdir(parents=True)
        (plain / checkpoint_store.step_dir(step) / "state.pt").write_bytes(b"x" * step)
    assert checkpoint_store.sync_dir(plain, remote, final=False) == [1]  # step 2 may still be being written
    assert checkpoint_store.sync_dir(plain, remote, final=True) == [2]
    assert [c.step for c in checkpoint_store.list_complete(remote)] == [1, 2]

    # a Checkpointer's directory: a folder it is still writing (no .metadata yet) or pruning is never published
    managed = tmp_path / "managed"
    (managed / checkpoint_store.step_dir(7)).mkdir(parents=True)
    (managed / checkpoint_store.step_dir(7) / "__0_0.distcp").write_bytes(b"half")
    (managed / checkpoint_store.step_dir(8)).mkdir()
    (managed / checkpoint_store.RUNTIME_MARKER).touch()
    assert checkpoint_store.sync_dir(managed, remote, final=True) == []
    assert [c.step for c in checkpoint_store.list_complete(remote)] == [1, 2]

    # a plain script that saves with torch.distributed.checkpoint itself (a .metadata file) is published too,
    # and a folder restored from the store (it carries a manifest) is not published again
    (plain / checkpoint_store.step_dir(3)).mkdir()
    (plain / checkpoint_store.step_dir(3) / ".metadata").write_bytes(b"dcp")
    (plain / checkpoint_store.step_dir(3) / "__0_0.distcp").write_bytes(b"shard")
    assert checkpoint_store.sync_dir(plain, remote, final=True, keep=3) == [3]
    assert checkpoint_store.sync_dir(plain, remote, final=True, keep=3) == []
    assert [c.step for c in checkpoint_store.list_complete(remote)] == [1, 2, 3]


def test_temp_files_of_a_killed_uploader_are_removed(tmp_path: Path) -> None:
    """A writer killed mid-upload leaves its temp file (file:// writes atomically through one): publishing that step
    again removes it, and retention removes a folder that holds nothing else."""
    root = (tmp_path / "store").as_uri()
    base = tmp_path / "store"
    (base / checkpoint_store.step_dir(5)).mkdir(parents=True)
    (base / checkpoint_store.step_dir(5) / ".__0_0.distcp.abcd.part").write_bytes(b"half")  # killed before step 5
    (base / checkpoint_store.step_dir(10)).mkdir(parents=True)
    (base / checkpoint_store.step_dir(10) / ".__0_0.distcp.ef01.part").write_bytes(b"half")  # killed, then re-saved
    for step in (10, 20, 30):
        _write_checkpoint(tmp_path / "local", root, step)
    assert not list((base / checkpoint_store.step_dir(10)).glob(".*.part"))
    checkpoint_store.apply_retention(root, keep=2)
    assert sorted(p.name for p in base.iterdir()) == [checkpoint_store.step_dir(20), checkpoint_store.step_dir(30)]


def test_unsupported_scheme_is_a_clear_error() -> None:
    with pytest.raises(storage.UserError, match="not supported"):
        storage.store_for("ftp://host/x")


UPLOADER = """
import sys
from pathlib import Path
from cloudtrain import storage
from cloudtrain.node import checkpoint_store
root, remote = Path(sys.argv[1]), sys.argv[2]
names = sorted(p.name for p in root.iterdir())
files = checkpoint_store.describe_files(root, names)
checkpoint_store.upload_files(root, files, remote)
checkpoint_store.publish(remote, 20, files, world_size=1)
"""


def test_upload_killed_mid_checkpoint_falls_back_to_the_previous(store_root: str, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO, wait_for

    _write_checkpoint(tmp_path / "local", store_root, 10)
    big = tmp_path / "local" / checkpoint_store.step_dir(20)
    big.mkdir(parents=True)
    for i in range(200):  # enough files, uploaded one at a time, that the kill lands half-way on every store
        (big / f"__{i}_0.distcp").write_bytes(os.urandom(1 << 18))
    remote = storage.join(store_root, checkpoint_store.step_dir(20))
    # several at once, the whole checkpoint can reach a fast store between two listings (it did, on GCS)
    env = {**os.environ, "PYTHONPATH": str(REPO), contract.TRANSFER_THREADS: "1"}
    proc = subprocess.Popen([sys.executable, "-c", UPLOADER, str(big), remote], env=env)
    store = storage.store_for(store_root)
    try:
        wait_for(lambda: len(store.list(remote)) >= 2, timeout=60, interval=0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # the node dies mid-upload
        proc.wait()
    uploaded = store.list(remote)
    assert 2 <= len(uploaded) < 200 and not any(u.endswith(checkpoint_store.MANIFEST) for u in uploaded)
    assert [c.step for c in checkpoint_store.list_complete(store_root)] == [10]
    found = checkpoint_store.restore_latest(store_root, tmp_path / "restore")
    assert found is not None and found.step == 10


def test_log_upload_that_fails_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`upload-logs` (the bootstrap's last step on a node) exits 1 with one line, no traceback; the bootstrap then
    records where the logs still are as a warning in the node's status."""
    from cloudtrain.node import output_upload

    logs = tmp_path / "worker-logs" / "run_0" / "attempt_0" / "0"
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text("hello")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the output folder should be")
    assert output_upload.main(["upload-logs", str(tmp_path / "worker-logs"), blocked.as_uri()]) == 1
    out = capsys.readouterr()
    assert out.out.startswith("[cloudtrain] error: upload of ") and out.out.count("\n") == 1
    assert "Traceback" not in out.out + out.err
