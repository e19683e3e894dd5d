"""The store conformance suite, shipped with cloudtrain so a store plugin's own package tests itself with it (no
cloudtrain source checkout needed): every store, built in or a plugin, passes the same tests, the object operations
and the checkpoint protocol on top of them (manifest last, retention, fallback past a corrupt or cut-off checkpoint).

    from cloudtrain.testing.stores import StoreConformance

    class TestMine(StoreConformance):
        @pytest.fixture
        def store_root(self, tmp_path):
            return "r2://bucket/" + tmp_path.name   # a fresh, empty prefix on the store

The fixture is the only thing a plugin writes: everything else comes from here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain import contract, storage
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import retention as checkpoint_retention
from cloudtrain.checkpoint import store as checkpoint_store

_UPLOADER = """
import sys
from pathlib import Path
from cloudtrain.checkpoint import store as checkpoint_store
root, remote = Path(sys.argv[1]), sys.argv[2]
files = checkpoint_store.describe_files(root, sorted(p.name for p in root.iterdir()))
checkpoint_store.upload_files(root, files, remote)
checkpoint_store.publish(remote, 20, files, world_size=1)
"""


def write_checkpoint(root: Path, store_root: str, step: int, publish: bool = True) -> list[dict]:
    """A small checkpoint of two files (one in a subfolder) uploaded as step ``step``, published unless not."""
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


class StoreConformance:
    """Inherit it and give a ``store_root`` fixture: a fresh, empty prefix (``scheme://bucket/prefix``)."""

    def test_object_operations(self, store_root: str, tmp_path: Path) -> None:
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
        size, chunks = store.read_stream(storage.join(store_root, "c", "big.bin"), 1000, 5000)
        assert size == source.stat().st_size and b"".join(chunks) == source.read_bytes()[1000:5000]
        assert store.list(store_root) == sorted([uri, storage.join(store_root, "c", "big.bin")])
        assert store.list(storage.join(store_root, "a")) == [uri]
        store.delete([uri, storage.join(store_root, "never-existed")])
        assert not store.exists(uri)
        assert store.list(storage.join(store_root, "a")) == []

    def test_manifest_last_retention_and_fallback(self, store_root: str, tmp_path: Path) -> None:
        for step in (10, 20, 30):
            write_checkpoint(tmp_path / "local", store_root, step)
        write_checkpoint(tmp_path / "local", store_root, 40, publish=False)  # cut off before its manifest
        assert [c.step for c in checkpoint_store.list_complete(store_root)] == [10, 20, 30]
        assert checkpoint_retention.apply_retention(store_root, keep=2) == [10]
        assert [c.step for c in checkpoint_store.list_complete(store_root)] == [20, 30]
        # the partial step 40 is newer than the newest complete one: left alone, it may still be in flight
        assert any("step-000000040" in u for u in storage.store_for(store_root).list(store_root))
        # corrupt the newest complete checkpoint: restore says so and falls back to the previous one
        store = storage.store_for(store_root)
        store.write_bytes(storage.join(store_root, checkpoint_store.step_dir(30), "__0_0.distcp"), b"bit rot")
        messages: list[str] = []
        found = checkpoint_restore.restore_latest(store_root, tmp_path / "restore", log=messages.append)
        assert found is not None and found.step == 20
        assert any("corrupt" in m and "falling back" in m for m in messages)
        restored = tmp_path / "restore" / checkpoint_store.step_dir(20)
        assert (restored / "__0_0.distcp").read_bytes() == b"shard-20" * 100
        assert json.loads((restored / checkpoint_store.MANIFEST).read_text())["step"] == 20
        assert not (tmp_path / "restore" / checkpoint_store.step_dir(30)).exists()

    def test_retention_never_deletes_the_last_complete(self, store_root: str, tmp_path: Path) -> None:
        write_checkpoint(tmp_path / "local", store_root, 5)
        assert checkpoint_retention.apply_retention(store_root, keep=1) == []
        assert [c.step for c in checkpoint_store.list_complete(store_root)] == [5]

    def test_upload_killed_mid_checkpoint_falls_back_to_the_previous(self, store_root: str, tmp_path: Path) -> None:
        write_checkpoint(tmp_path / "local", store_root, 10)
        big = tmp_path / "local" / checkpoint_store.step_dir(20)
        big.mkdir(parents=True)
        for i in range(200):  # enough files, uploaded one at a time, that the kill lands half-way on every store
            (big / f"__{i}_0.distcp").write_bytes(os.urandom(1 << 18))
        remote = storage.join(store_root, checkpoint_store.step_dir(20))
        installed = str(Path(storage.__file__).resolve().parents[2])  # where this cloudtrain is imported from
        env = {**os.environ, contract.TRANSFER_THREADS: "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [installed, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen([sys.executable, "-c", _UPLOADER, str(big), remote], env=env)
        store = storage.store_for(store_root)
        try:
            deadline = time.monotonic() + 60
            while len(store.list(remote)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)  # the node dies mid-upload
            proc.wait()
        uploaded = store.list(remote)
        assert 2 <= len(uploaded) < 200 and not any(u.endswith(checkpoint_store.MANIFEST) for u in uploaded)
        assert [c.step for c in checkpoint_store.list_complete(store_root)] == [10]
        found = checkpoint_restore.restore_latest(store_root, tmp_path / "restore")
        assert found is not None and found.step == 10

    def test_copy_within_the_store(self, store_root: str, tmp_path: Path) -> None:
        """``copy`` (optional): the store copies an object itself. Node 0 of a multi-node job takes the other nodes'
        checkpoint files into a checkpoint this way; a store without it has them downloaded and uploaded again."""
        store, copy = storage.store_for(store_root), storage.copier(store_root)
        if copy is None:
            pytest.skip("this store has no copy(): node 0 downloads other nodes' checkpoint files and uploads them")
            return
        data = os.urandom(20 * 1024 * 1024 + 5)  # above S3's 16 MiB multipart threshold: copied in parts there
        (tmp_path / "big.bin").write_bytes(data)
        big, empty = storage.join(store_root, "part", "big.bin"), storage.join(store_root, "part", "empty")
        store.put_file(tmp_path / "big.bin", big)
        store.write_bytes(empty, b"")
        assert copy(big, storage.join(store_root, "step", "big.bin")) == len(data)
        assert copy(empty, storage.join(store_root, "step", "empty")) == 0
        store.delete([big, empty])  # the copies stand on their own
        store.get_file(storage.join(store_root, "step", "big.bin"), tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == data
        assert store.read_bytes(storage.join(store_root, "step", "empty")) == b""

    def test_an_unknown_scheme_is_a_clear_error(self) -> None:
        with pytest.raises(storage.UserError, match="not supported"):
            storage.store_for("ftp-never-registered://host/x")
