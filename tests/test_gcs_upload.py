"""GCS uploads (cloudtrain/storage/gcs.py): one streamed request per file, resumed where the session stopped, its
crc32c checked against the stored object. Real parts: gcp-storage-emulator behind tests/faultproxy.py, which cuts an
upload off half-way (``cut_request``), spoils its body (``flip_request``) or cuts a reply inside its headers
(``truncate``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import store as checkpoint_store
from tests.faultproxy import Request
from tests.faulty import MIB, Faulty


def _random_file(path: Path, size: int) -> Path:
    path.write_bytes(random.Random(size).randbytes(size))
    return path


@pytest.mark.parametrize("faulty", ["gs"], indirect=True)
def test_gcs_upload_cut_off_midway_resumes_where_the_session_stopped(faulty: Faulty, tmp_path: Path) -> None:
    """The connection drops half-way through a large file's one PUT: the session is asked what it has, and only the
    rest is sent again. The object is whole, its crc32c agrees, and progress counted every byte once."""
    size = 12 * MIB
    source = _random_file(tmp_path / "shard.bin", size)
    bodies: list[int] = []  # the size of each request body sent to the upload session

    def first_put_to_the_session(request: Request) -> bool:
        if request.method == "PUT" and "upload_id=" in request.target:
            bodies.append(len(request.body))
            return len(bodies) == 1
        return False

    uri, progress = storage.join(faulty.root, "resumed/shard.bin"), []
    with faulty.proxy.calm(), faulty.proxy.fail_matching(first_put_to_the_session, kind="cut_request"):
        assert storage.store_for(uri).put_file(source, uri, progress.append) == size
        assert faulty.proxy.injected["cut_request"] == 1
        assert bodies == [size, 0, size - size // 2]  # everything; the status query; the half it did not get
        assert sum(progress) == size
        assert storage.read_bytes(uri) == source.read_bytes()


@pytest.mark.parametrize("faulty", ["gs"], indirect=True)
@pytest.mark.parametrize("size", [64 * 1024, 12 * MIB], ids=["single-request", "resumable"])
def test_gcs_upload_spoilt_in_transit_is_caught_and_sent_again(faulty: Faulty, size: int, tmp_path: Path) -> None:
    """One bit of the body flipped on the way, which no length check notices: the crc32c of the object the service
    made is not that of the bytes sent, so the upload fails (and ``upload_files`` retries it whole)."""
    folder = tmp_path / "step"
    folder.mkdir()
    source = _random_file(folder / "shard.bin", size)
    remote = storage.join(faulty.root, f"spoilt-{size}")
    uri = storage.join(remote, "shard.bin")

    def carries_the_file(request: Request) -> bool:
        return request.method in ("POST", "PUT") and len(request.body) == size

    with faulty.proxy.calm():
        with faulty.proxy.fail_matching(carries_the_file, kind="flip_request", times=1), \
                pytest.raises(OSError, match="crc32c"):
            storage.store_for(uri).put_file(source, uri)
        messages: list[str] = []
        with faulty.proxy.fail_matching(carries_the_file, kind="flip_request", times=1):
            checkpoint_store.upload_files(folder, checkpoint_store.describe_files(folder, ["shard.bin"]), remote,
                                     log=messages.append)
        assert faulty.proxy.injected["flip_request"] == 2
        assert [m for m in messages if "crc32c" in m and "retry 1/4" in m], messages
        assert storage.read_bytes(uri) == source.read_bytes()


@pytest.mark.parametrize("faulty", ["gs"], indirect=True)
def test_gcs_manifest_spoilt_in_transit_is_published_again(faulty: Faulty, tmp_path: Path) -> None:
    """The manifest (``write_bytes``) goes through the same checked upload: a spoilt one is refused, published again,
    and never left as the checkpoint's manifest."""
    with faulty.proxy.calm():
        folder = tmp_path / checkpoint_store.step_dir(10)
        folder.mkdir()
        _random_file(folder / "shard.bin", 64 * 1024)
        files = checkpoint_store.describe_files(folder, ["shard.bin"])
        remote = storage.join(faulty.root, checkpoint_store.step_dir(10))
        checkpoint_store.upload_files(folder, files, remote)
        messages: list[str] = []
        with faulty.proxy.fail_matching(lambda r: r.method == "POST" and r.mentions(checkpoint_store.MANIFEST),
                                        kind="flip_request", times=1):
            checkpoint_store.publish(remote, 10, files, world_size=1, log=messages.append)
        assert faulty.proxy.injected["flip_request"] == 1
        assert [m for m in messages if "crc32c" in m], messages
        assert [c.step for c in checkpoint_store.list_complete(faulty.root, log=messages.append)] == [10], messages


@pytest.mark.parametrize("faulty", ["gs"], indirect=True)
def test_gcs_upload_session_whose_start_was_cut_short_is_started_again(faulty: Faulty, tmp_path: Path) -> None:
    """The reply that starts a session is cut inside its headers, so the session URI arrives half-written: a new
    session is started, rather than the half URI retried until the retry deadline (120 s)."""
    size = 9 * MIB
    source = _random_file(tmp_path / "shard.bin", size)
    starts: list[str] = []

    def first_session_start(request: Request) -> bool:
        if request.method == "POST" and "uploadType=resumable" in request.target:
            starts.append(request.target)
            return len(starts) == 1
        return False

    uri = storage.join(faulty.root, "restarted/shard.bin")
    with faulty.proxy.calm(), faulty.proxy.fail_matching(first_session_start, kind="truncate"):
        assert storage.store_for(uri).put_file(source, uri) == size
        assert faulty.proxy.injected["truncate"] == 1 and len(starts) == 2
        assert storage.read_bytes(uri) == source.read_bytes()
