"""One conformance suite for every storage backend, and the checkpoint protocol on each."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.checkpoint import retention as checkpoint_retention
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint import sync as checkpoint_sync
from cloudtrain.testing.stores import StoreConformance, write_checkpoint


class TestBuiltinStores(StoreConformance):
    """file://, S3 (moto), GCS (gcp-storage-emulator), Azure (Azurite): conftest's ``store_root``."""


def test_plain_script_sync_publishes_complete_folders_and_leaves_runtime_dirs_alone(tmp_path: Path) -> None:
    remote = (tmp_path / "bucket").as_uri()
    plain = tmp_path / "plain"
    for step in (1, 2):
        (plain / checkpoint_store.step_dir(step)).mkdir(parents=True)
        (plain / checkpoint_store.step_dir(step) / "state.pt").write_bytes(b"x" * step)
    assert checkpoint_sync.sync_dir(plain, remote, final=False) == [1]  # step 2 may still be being written
    assert checkpoint_sync.sync_dir(plain, remote, final=True) == [2]
    assert [c.step for c in checkpoint_store.list_complete(remote)] == [1, 2]

    # a Checkpointer's directory: a folder it is still writing (no .metadata yet) or pruning is never published
    managed = tmp_path / "managed"
    (managed / checkpoint_store.step_dir(7)).mkdir(parents=True)
    (managed / checkpoint_store.step_dir(7) / "__0_0.distcp").write_bytes(b"half")
    (managed / checkpoint_store.step_dir(8)).mkdir()
    (managed / checkpoint_store.RUNTIME_MARKER).touch()
    assert checkpoint_sync.sync_dir(managed, remote, final=True) == []
    assert [c.step for c in checkpoint_store.list_complete(remote)] == [1, 2]

    # a plain script that saves with torch.distributed.checkpoint itself (a .metadata file) is published too,
    # and a folder restored from the store (it carries a manifest) is not published again
    (plain / checkpoint_store.step_dir(3)).mkdir()
    (plain / checkpoint_store.step_dir(3) / ".metadata").write_bytes(b"dcp")
    (plain / checkpoint_store.step_dir(3) / "__0_0.distcp").write_bytes(b"shard")
    assert checkpoint_sync.sync_dir(plain, remote, final=True, keep=3) == [3]
    assert checkpoint_sync.sync_dir(plain, remote, final=True, keep=3) == []
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
        write_checkpoint(tmp_path / "local", root, step)
    assert not list((base / checkpoint_store.step_dir(10)).glob(".*.part"))
    checkpoint_retention.apply_retention(root, keep=2)
    assert sorted(p.name for p in base.iterdir()) == [checkpoint_store.step_dir(20), checkpoint_store.step_dir(30)]


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
