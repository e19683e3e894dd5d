"""A restored checkpoint's DCP shards, fetched only by the ranks whose load reads them (stdlib only).

A Checkpointer's checkpoint holds every rank's shards (``__<rank>_<i>.distcp``). On N nodes at an unchanged
sharding (FSDP, HSDP within a node), a node's ranks read 1/N of them; replicated state (DDP) is read whole by every
rank. A node that downloaded the whole checkpoint (as every node did before) moved N times what it needed, and a
preemption of an 8-node job moved the checkpoint 8 times. So on several nodes the node's restore before its
workers start (restore.py) brings the checkpoint's small files (DCP's ``.metadata``, the ranks' extra state) and
any shard the node already holds (a restart in place), and writes the manifest; each rank's load then names the
files it reads (cloudtrain/runtime/dcp_files.py) and ``OnDemand.fetch`` brings those the node's folder lacks. They
are verified against the manifest like any restore (size and sha256, hashed as they arrive; a mismatch is fetched a
second time before it counts), and placed only once they match, so a file in the folder is always a verified one.
The node's ranks share the folder: a file one of them is fetching, the others wait for (a lock per file, released
by the kernel if its holder dies), so each file crosses the network once per node.

A file that does not match is CorruptCheckpoint: the Checkpointer's ranks agree on it, the checkpoint is quarantined
(store.quarantine), and they fall back to the previous one, as a node's restore does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import safe_json, storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.download import Restored, fetch_verified, log_line
from cloudtrain.checkpoint.manifest import MANIFEST, CorruptCheckpoint, checked_files, step_dir
from cloudtrain.errors import CloudtrainError

try:  # POSIX (every node, macOS); without it each process fetches what it lacks itself, still atomically
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]

FETCHING = ".cloudtrain-fetching"  # in the step folder: a lock per file, and the files on their way


class OnDemand:
    """Checkpoint ``step`` of the store ``uri``, restored into ``folder`` (the node's ``<dir>/step-<N>``), perhaps
    without its shards: ``fetch`` brings the files a load reads. Its manifest is the node's copy in the folder, or,
    where this node restored another step (its own fallback), the store's."""

    def __init__(self, uri: str, step: int, folder: Path, log: Log = log_line) -> None:
        self.uri, self.step, self.folder, self.log = uri, step, folder, log
        self.checkpoint_uri = storage.join(uri, step_dir(step))
        self.fetched = Restored()  # what this process brought, for its log line
        self.fetched_files = 0
        self._entries: dict[str, dict[str, Any]] | None = None
        self._manifest: dict[str, Any] | None = None

    @property
    def manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            self._manifest = self._read_manifest()
        return self._manifest

    def _read_manifest(self) -> dict[str, Any]:
        local = self.folder / MANIFEST
        try:
            data = local.read_bytes()
        except FileNotFoundError:  # this node restored another step: the store's word
            try:
                data = storage.with_retries(lambda: storage.read_bytes(storage.join(self.checkpoint_uri, MANIFEST)),
                                            f"reading {self.checkpoint_uri}/{MANIFEST}", log=self.log)
            except Exception as exc:  # gone (retention, by another job's hand) or never whole: not loadable
                raise CorruptCheckpoint(f"its manifest could not be read ({exc})") from exc
        try:
            manifest = safe_json.loads(data, "its manifest")
        except safe_json.UnreadableJson as exc:  # not JSON, nested or sized as no manifest is
            raise CorruptCheckpoint(exc.message) from exc
        if not isinstance(manifest, dict):
            raise CorruptCheckpoint(f"the manifest is a {type(manifest).__name__}, not an object")
        return manifest

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = {f["path"]: f for f in checked_files(self.manifest, self.step)}
        return self._entries

    def listed(self, path: str) -> bool:
        return path in self.entries

    def fetch(self, paths: Iterable[str]) -> None:
        """Bring the files ``paths`` (relative to the folder) that the folder does not hold yet. Raises
        CorruptCheckpoint when one is not in the manifest or does not match it, CloudtrainError when the store
        cannot be read."""
        wanted = []
        for path in dict.fromkeys(paths):
            entry = self.entries.get(path)
            if entry is None:
                raise CorruptCheckpoint(f"{path} is read by this load but its manifest does not list it")
            if not self._present(entry):
                wanted.append(entry)
        if not wanted:
            return
        started = time.monotonic()
        work = self.folder / FETCHING
        work.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            locks = [held.enter_context(_locked(work / f"{_key(entry['path'])}.lock")) for entry in wanted]
            free = [lock.wait(block=False) for lock in locks]
            self._bring([e for e, mine in zip(wanted, free) if mine and not self._present(e)], work)
            for lock, mine in zip(locks, free):
                if mine:  # ours are in place: released before waiting on another rank's, who may wait on ours
                    lock.close()
            for lock, mine in zip(locks, free):
                if not mine:  # another rank of this node is fetching it: wait for its end (never holding a lock)
                    lock.wait(block=True)
                    lock.close()
            # what such a rank did not bring (it failed or died), each fetches itself
            self._bring([e for e, mine in zip(wanted, free) if not mine and not self._present(e)], work)
        self.fetched.seconds += time.monotonic() - started

    def _present(self, entry: dict[str, Any]) -> bool:
        local = self.folder / entry["path"]
        try:  # a file in the folder was verified when it was placed; a wrong size is a leftover of something else
            return local.is_file() and local.stat().st_size == int(entry["size"])
        except OSError:
            return False

    def _bring(self, entries: list[dict[str, Any]], work: Path) -> None:
        if not entries:
            return
        store = storage.store_for(self.checkpoint_uri)
        items = [(storage.join(self.checkpoint_uri, e["path"]), work / f"{_key(e['path'])}.{os.getpid()}.part",
                  int(e["size"])) for e in entries]
        try:
            # the Checkpointer's files are never rewritten in place: a file:// store's may be linked
            fetch_verified(store, items, entries, self.manifest.get("kind") == "full", self.log)
            for entry, (_uri, part, _size) in zip(entries, items):
                target = self.folder / entry["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(part, target)
        finally:
            for _uri, part, _size in items:
                part.unlink(missing_ok=True)
        self.fetched.bytes += sum(int(e["size"]) for e in entries)
        self.fetched_files += len(entries)

    def quarantine(self, reason: str) -> None:
        """Mark this checkpoint corrupt in the store, so that no later listing takes it (store.quarantine): this very
        manifest, never another one of the same step (a marker names its manifest's digest). Best effort, as
        store.quarantine is: a store that cannot be listed now only means the next restore checks it again."""
        try:
            listed = checkpoint_store.list_complete(self.uri, log=lambda _m: None)
        except CloudtrainError as exc:
            self.log(f"could not mark {self.checkpoint_uri} as corrupt in the store ({exc.message}); the next restore "
                     "checks it again")
            return
        for checkpoint in listed:
            if checkpoint.step == self.step and checkpoint.manifest == self.manifest:
                checkpoint_store.quarantine(checkpoint, reason, log=self.log)


def _key(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:32]


class _Lock:
    """A lock on one file's fetch, shared by the processes of a node (flock: the kernel releases it when its holder
    dies, so a killed rank never leaves the others waiting)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if fcntl is not None else -1

    def wait(self, block: bool) -> bool:
        if self.fd < 0:
            return True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


@contextlib.contextmanager
def _locked(path: Path) -> Any:
    lock = _Lock(path)
    try:
        yield lock
    finally:
        lock.close()

