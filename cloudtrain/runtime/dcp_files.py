"""A rank's DCP files, written hashed and read in parallel: torch's FileSystemWriter/Reader with two changes.

Writing: each ``.distcp`` file is hashed as DCP writes it (the bytes pass through memory once; no pass that reads
the files back to hash them), and the moment DCP closes it, it is handed on (``written(name, size, sha256)``: the
Checkpointer starts its upload then, so writing, hashing and uploading overlap across a rank's files).

Reading: torch's FileSystemReader loads a rank's files one after another on one thread (~1 GB/s on an H200's
disk, where the same files hash at 5.6 GB/s in parallel). This reader loads each file on a thread of its own; the
planner (which owns the state dict) is called under one lock, the reads and the copies into the training tensors
run at once.

Both keep torch's file format and use only what torch's own classes expose (``fs.create_stream``, the load
plan's items and ``storage_data``), so a checkpoint written by either loads with the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.futures import Future

from cloudtrain.checkpoint.manifest import is_shard

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Written = Callable[[str, int, str], None]  # (file name in the step folder, bytes, sha256)


WRITEBACK_BYTES = 64 << 20  # a durable shard's bytes are sent to disk in steps of this, while DCP writes on
_writeback_pool: ThreadPoolExecutor | None = None
_writeback_lock = threading.Lock()


def _writeback(fd: int) -> None:
    try:
        os.fdatasync(fd)
    except OSError:
        pass  # only a head start: the store's own fsync (storage/local.py link_file) is the one that counts
    finally:
        os.close(fd)


def _start_writeback(fileno: int) -> None:
    """Send what a file holds so far to disk on a background thread (its own descriptor: the file may close first)."""
    global _writeback_pool
    with _writeback_lock:
        if _writeback_pool is None:
            _writeback_pool = ThreadPoolExecutor(4, thread_name_prefix="cloudtrain-writeback")
        _writeback_pool.submit(_writeback, os.dup(fileno))


class _HashedFile:
    """A file being written, with the sha256 of every byte written to it so far. ``durable``: it is the copy the
    store keeps (a file:// store links it, then fsyncs it), so its bytes go to disk while DCP writes on, and that
    fsync finds little left to do."""

    def __init__(self, raw: Any, durable: bool) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.durable = durable
        self.unsynced = 0

    def write(self, data: Any) -> int:
        written = int(self.raw.write(data))  # a buffered file writes all of it, or raises
        self.sha256.update(data)  # releases the GIL on large buffers: the other writer threads go on
        self.size += written
        self.unsynced += written
        if self.durable and self.unsynced >= WRITEBACK_BYTES:
            self.raw.flush()
            _start_writeback(self.raw.fileno())
            self.unsynced = 0
        return written

    def tell(self) -> int:
        return int(self.raw.tell())

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def close(self) -> None:
        self.raw.close()

    def writable(self) -> bool:
        return True


class HashingFileSystem(FileSystem):
    """torch's FileSystem, where every ``.distcp`` file written is hashed as written and reported once closed."""

    def __init__(self, written: Written, durable: bool = False) -> None:
        super().__init__()
        self.written, self.durable = written, durable

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        name = os.path.basename(os.fspath(path))
        if mode != "wb" or not is_shard(name):  # the metadata (renamed into place): hashed later
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open(path, "wb") as raw:
            hashed = _HashedFile(raw, self.durable)
            yield hashed  # DCP closes it
        self.written(name, hashed.size, hashed.sha256.hexdigest())


def writer(folder: str, threads: int, written: Written | None = None, durable: bool = False) -> dcp.FileSystemWriter:
    """DCP's file writer for one save: ``threads`` files per rank, no fsync (the store's copy is the durable one),
    each shard hashed as written and reported to ``written`` once closed. ``durable``: the shards themselves become
    the store's copy (a file:// store links them), so their bytes start for the disk while DCP writes."""
    made = dcp.FileSystemWriter(folder, thread_count=threads, sync_files=False)
    if written is not None and isinstance(getattr(made, "fs", None), FileSystem):
        made.fs = HashingFileSystem(written, durable)
    return made


SMALL_REPLICATED = 1 << 20  # bytes: a replicated item up to this size is written by the lowest rank holding it
# torch's save-plan cache: a save whose layout is unchanged skips the global planning. torch has it since 2.7, but
# it was mended since (a stale cache after a failed validation; a reported crash on 2.10, "unexpected pos", for bytes
# items): it is used from the torch it is tested on here (2.13), and older ones plan every save as before
PLAN_CACHING = torch.__version__ >= "2.13" and \
    "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters


class SavePlanner(DefaultSavePlanner):
    """torch's save planner, but a small item several ranks hold (an optimizer's step counts and param groups, under
    FSDP) is written by the lowest rank holding it, not by whichever rank had written least so far. torch's choice
    put a little of every rank's file in every rank's load: on several nodes each node then needed every shard
    (cloudtrain/checkpoint/on_demand.py fetches whole files). Now a sharded rank reads its own files and the
    lowest rank's. Large replicated items (DDP's whole state) stay spread over the ranks, as torch spreads them, so
    writing them stays shared. Where torch's planner does not call its ``_dedup_save_plans`` hook (torch 2.13
    does), torch's own choice stands, and loads the same.

    ``cache_key``: the plans are cached under it (torch's plan caching, from torch 2.13: ``PLAN_CACHING``; the cache
    is process-wide, so each Checkpointer gives a key of its own). A save whose state has the same layout as the
    last one under that key then sends no plans to rank 0 and skips the global planning: rank 0 reuses the last
    global plan and metadata, and each rank its last final plan. A changed layout (a param group added, a buffer
    registered) is planned again."""

    def __init__(self, cache_key: str | None = None) -> None:
        if cache_key is not None and PLAN_CACHING:
            super().__init__(enable_plan_caching=True)
            self._cached_plans_key = cache_key
        else:
            super().__init__()

    def _dedup_save_plans(self, all_plans: list[Any]) -> list[Any]:
        holders: dict[Any, list[int]] = {}  # item -> the ranks whose plans hold it, lowest first
        for rank, plan in enumerate(all_plans):
            for item in plan.items:
                holders.setdefault(item.index, []).append(rank)

        def kept(rank: int, item: Any) -> bool:
            ranks = holders[item.index]
            return len(ranks) == 1 or (item.tensor_storage_size() or 0) > SMALL_REPLICATED or ranks[0] == rank

        trimmed = [dataclasses.replace(plan, items=[item for item in plan.items if kept(rank, item)])
                   for rank, plan in enumerate(all_plans)]
        return cast("list[Any]", super()._dedup_save_plans(trimmed))


class LoadPlanner(DefaultLoadPlanner):
    """torch's load planner, noting what the checkpoint holds that the state being loaded has no place for
    (``left_out``: DCP's flattened names). DCP loads the rest and leaves those out without a word: optimizer state of
    a layer frozen now that was trained when it was saved, a buffer the model no longer registers."""

    left_out: list[str] = []

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is not None:
            self.left_out = sorted(set(metadata.state_dict_metadata) - set(self.state_dict))


class _OneAtATime:
    """The load planner, called by one reader thread at a time (it owns the state dict being filled)."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner
        self._lock = threading.Lock()

    def resolve_tensor(self, item: Any) -> Any:
        with self._lock:
            return self._planner.resolve_tensor(item)

    def commit_tensor(self, item: Any, tensor: Any) -> None:
        with self._lock:
            self._planner.commit_tensor(item, tensor)

    def load_bytes(self, item: Any, value: Any) -> None:
        with self._lock:
            self._planner.load_bytes(item, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


class ParallelFileSystemReader(dcp.FileSystemReader):
    """torch's FileSystemReader, loading up to ``threads`` of the rank's files at once. ``before_read`` is given the
    files the rank's load plan reads, before any is read (cloudtrain/checkpoint/on_demand.py fetches those the
    node's folder lacks); what it raises reaches every rank as DCP's CheckpointException, with nothing loaded."""

    def __init__(self, folder: str, threads: int, before_read: Callable[[list[str]], None] | None = None) -> None:
        super().__init__(folder)
        self.threads = max(1, threads)
        self.before_read = before_read

    def prepare_local_plan(self, plan: Any) -> Any:
        if self.before_read is not None:
            self.before_read(sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}))
        return super().prepare_local_plan(plan)

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        if self.threads == 1 or len(per_file) <= 1:
            return super().read_data(plan, planner)
        shared: Any = _OneAtATime(planner)  # a LoadPlanner to torch's reader
        read_one = super().read_data
        with ThreadPoolExecutor(min(self.threads, len(per_file)), thread_name_prefix="cloudtrain-load") as pool:
            loads = [pool.submit(read_one, dataclasses.replace(plan, items=items), shared)
                     for items in per_file.values()]
            for load in loads:
                load.result().wait()  # the first error, as torch's reader would raise it
        done: Future[None] = Future()
        done.set_result(None)
        return done
