"""The in-worker Checkpointer's saves and restores, without torch (cloudtrain/runtime/checkpointer.py is its torch
face: state dicts, DCP, the collectives between ranks). Stdlib only.

What is here: the settings the job spec gave the Checkpointer (CLOUDTRAIN_CHECKPOINT_*), the node's checkpoint
request file (a spot notice: cloudtrain/node/spot_notice.py writes it), which files of a ``step-<N>`` folder a rank
writes, their upload, rank 0's publish and what follows it (retention, the local prune, the unpublished marker), and
which step a restore loads: the one the node restored before the workers started, or the newest on this disk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import contract, storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import MANIFEST, step_dir
from cloudtrain.checkpoint.retention import retain
from cloudtrain.errors import CloudtrainError
from cloudtrain.storage.transfer import threads as transfer_threads

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]

UNKNOWN = object()  # the node restored nothing for this Checkpointer: it restores itself
_node_restore_used = False  # the node's restore serves the first restore of this worker process only


def _env_seconds(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


@dataclass(frozen=True)
class Settings:
    """Where a Checkpointer saves and how often: the arguments given, else what the job spec set."""

    uri: str | None
    local_dir: Path
    every_seconds: float | None
    keep: int

    @classmethod
    def resolve(cls, uri: str | None = None, local_dir: str | Path | None = None, every_seconds: float | None = None,
                keep: int | None = None) -> Settings:
        job = os.environ.get(contract.JOB_ID, "job")
        return cls(uri=uri or os.environ.get(contract.CHECKPOINT_URI) or None,
                   local_dir=Path(local_dir or os.environ.get(contract.CHECKPOINT_DIR)
                                  or f"/tmp/cloudtrain-checkpoints/{job}"),
                   every_seconds=every_seconds if every_seconds is not None else
                   _env_seconds(contract.CHECKPOINT_INTERVAL),
                   keep=contract.keep_count(str(keep) if keep else os.environ.get(contract.CHECKPOINT_KEEP)))


def write_threads() -> int:
    """Files each rank writes per checkpoint (DCP's FileSystemWriter ``thread_count``): written, hashed, uploaded
    and restored in parallel. The node's CPUs shared by its ranks, at most the transfer threads."""
    per_rank = (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(transfer_threads(), per_rank))


class CheckpointRequest:
    """The node's checkpoint request file (contract.CHECKPOINT_REQUEST): each write of it is one request."""

    def __init__(self) -> None:
        self.path = os.environ.get(contract.CHECKPOINT_REQUEST)
        self.seen = 0  # the node removes an earlier run's file: one there already is a notice before our first step

    def _stamp(self) -> int:
        try:
            return os.stat(self.path).st_mtime_ns if self.path else 0
        except OSError:
            return 0

    def new(self) -> bool:
        stamp = self._stamp()  # one stat per step: ~1 us
        if stamp == self.seen:
            return False
        self.seen = stamp
        return stamp != 0


def claim_folder(local_dir: Path) -> None:
    """The Checkpointer's folder, marked as its own before any step folder exists: the node's plain-script sync
    (sync.py) keeps out of it."""
    local_dir.mkdir(parents=True, exist_ok=True)
    (local_dir / checkpoint_store.RUNTIME_MARKER).touch()


def reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CloudtrainError) else str(exc)  # without the remedy: one is added later


def rank_files(folder: Path, rank: int) -> list[str]:
    """The files of a ``step-<N>`` folder this rank writes: its DCP shards, rank 0's ``.metadata``, its extra state."""
    mine = [p.name for p in folder.glob(f"__{rank}_*.distcp")]
    if rank == 0:
        mine.append(".metadata")
    return [*sorted(mine), f"extra/rank-{rank}.pt"]


def clear_rank_files(folder: Path, rank: int) -> None:
    """Remove this rank's files of an earlier attempt at this step before writing them again: a file is never
    rewritten in place, since a file:// store may hold the same file (a hard link: storage.local)."""
    if not folder.is_dir():
        return
    for rel in rank_files(folder, rank):
        (folder / rel).unlink(missing_ok=True)


def links_into_store(uri: str | None) -> bool:
    """Whether a save's files become the store's own copy (a file:// store hard-links them, then fsyncs them):
    then they are sent to disk while they are written."""
    return uri is not None and uri.startswith("file://")


class RankUpload:
    """One rank's files of a save on their way to the store: each DCP shard is uploaded the moment DCP closes it
    (``written``, from DCP's writer threads, with the sha256 taken as it was written: cloudtrain/runtime/dcp_files.py),
    so writing, hashing and uploading overlap; ``finish`` hashes and uploads the rest (the metadata, the extra state,
    any shard not reported) and returns every file's description, for rank 0's manifest. The files are written
    once, never in place (clear_rank_files): a file:// store may link them instead of copying."""

    def __init__(self, folder: Path, rank: int, uri: str, step: int, log: Log) -> None:
        self.folder, self.rank, self.log = folder, rank, log
        self.remote = storage.join(uri, step_dir(step))
        self.pool = ThreadPoolExecutor(transfer_threads(), thread_name_prefix="cloudtrain-upload")
        self.sent: dict[str, tuple[int, str, Future[int]]] = {}
        self.lock = threading.Lock()
        self._upload: Callable[[Path, str], int] | None = None  # made by the first upload: off training's thread

    def written(self, name: str, size: int, sha256: str) -> None:
        with self.lock:
            if self._upload is None:
                self._upload = checkpoint_store.uploader(self.remote, self.log, immutable=True)
            future = self.pool.submit(self._upload, self.folder / name, storage.join(self.remote, name))
            self.sent[name] = (size, sha256, future)

    def finish(self) -> list[dict[str, Any]]:
        with self.lock:
            sent = dict(self.sent)
        names = rank_files(self.folder, self.rank)
        rest = checkpoint_store.describe_and_upload(self.folder, [n for n in names if n not in sent], self.remote,
                                                    log=self.log, immutable=True)
        described = {entry["path"]: entry for entry in rest}
        for name, (size, sha256, future) in sent.items():
            future.result()  # the first failed upload's error (after its retries)
            on_disk = (self.folder / name).stat().st_size
            if on_disk != size:  # DCP wrote past what it closed: never describe a file other than the one sent
                raise CloudtrainError(f"{self.folder / name} is {on_disk} bytes on disk, {size} when it was written")
            described[name] = {"path": name, "size": size, "sha256": sha256}
        return [described[name] for name in names if name in described]

    def close(self) -> None:
        """Wait for the uploads in flight (a failed save's too: nothing writes into the store after it is judged)."""
        with self.lock:
            pending = [future for _, _, future in self.sent.values()]
        for future in pending:
            future.cancel()
        self.pool.shutdown(wait=True)


def publish_save(uri: str, step: int, files: list[dict[str, Any]], world_size: int, log: Log) -> str:
    """Rank 0, once every rank's files are in the store: write the manifest; returns the checkpoint's folder."""
    remote = storage.join(uri, step_dir(step))
    checkpoint_store.publish(remote, step, files, world_size=world_size, log=log)
    return remote


def after_publish(local_dir: Path, uri: str | None, keep: int, step: int, log: Log, warn: Log) -> None:
    """Rank 0, once a save is published: an earlier unpublished save's marker goes, and the store keeps ``keep``."""
    checkpoint_store.mark_published(local_dir)
    if uri:
        retain(uri, keep, f"step {step}", log=log, warn=warn)


def unpublished_message(step: int, uri: str | None, folder: Path, errors: list[str]) -> str:
    where = f"to {uri}" if uri else "locally"
    return (f"checkpoint step {step} was not saved {where}: {errors[0]}"
            + (f" (and {len(errors) - 1} more rank(s))" if len(errors) > 1 else "")
            + f"; its files are still in {folder}")


def node_restored_step(uri: str | None, local_dir: Path) -> Any:
    """The step this node's bootstrap restored for a Checkpointer of this ``uri`` and folder before the workers
    started (contract.RESTORED_STEP; None: nothing to restore), or UNKNOWN: the Checkpointer restores itself. Serves
    the first restore of the worker process only (a later one, after saves, looks at the store again)."""
    global _node_restore_used
    value, env = os.environ.get(contract.RESTORED_STEP), os.environ
    if _node_restore_used or value is None or uri != env.get(contract.CHECKPOINT_URI) or \
            not env.get(contract.CHECKPOINT_DIR) or \
            Path(env[contract.CHECKPOINT_DIR]).resolve() != local_dir.resolve():
        return UNKNOWN
    _node_restore_used = True
    if value == "none":
        return None
    step = int(value)
    if not (local_dir / step_dir(step) / MANIFEST).is_file():
        return UNKNOWN  # not where the bootstrap left it: look for ourselves
    return step


def newest_local(local_dir: Path, uri: str | None) -> int | None:
    """The newest step folder on this disk a restore may load: one with a manifest (restored or published), or,
    without a store, one DCP finished (its ``.metadata``)."""
    steps = []
    for folder in local_dir.glob("step-*"):
        if (folder / MANIFEST).is_file() or (not uri and (folder / ".metadata").is_file()):
            try:
                steps.append(int(folder.name.split("-")[1]))
            except ValueError:
                continue
    return max(steps) if steps else None
