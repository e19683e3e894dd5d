"""The checkpoint protocol's store side, shared by the in-job Checkpointer, the node's restore and the plain-script
sync: list the checkpoints a store holds, upload a folder's files and publish its manifest, mark a corrupt one. No
torch here: it moves and verifies files.

A checkpoint is ``<uri>/step-<N>/`` plus ``manifest.json`` written LAST (step, kind, world size, every file with
its size and sha256). Without its manifest a folder does not exist. A checkpoint a restore found corrupt is marked
in the store (``quarantine-<manifest digest>.json``) so that every later listing (retention, in whatever process
runs it later) skips it; one a start could not load is set aside (``set-aside-<manifest digest>.json``,
set_aside.py): skipped by every restore, never deleted. Restore (restore.py), retention (retention.py) and the
plain-script sync (sync.py) build on this module; the component's command line is __main__.py
(``python -m cloudtrain.checkpoint``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from cloudtrain import contract, safe_json, storage
from cloudtrain.checkpoint import writer
from cloudtrain.checkpoint.download import Restored, download, log_line
from cloudtrain.checkpoint.manifest import (
    MANIFEST,
    Checkpoint,
    CorruptCheckpoint,
    checked_files,
    quarantine_name,
    safe_relative,
    set_aside_name,
    step_dir,
    step_of,
)
from cloudtrain.errors import CloudtrainError
from cloudtrain.storage import transfer

__all__ = ["MANIFEST", "RUNTIME_MARKER", "UNPUBLISHED_MARKER", "Checkpoint", "CheckpointNotPublished",
           "CorruptCheckpoint", "Restored", "describe_and_upload", "describe_files", "download", "list_complete",
           "publish", "sha256_file", "step_dir", "survey", "upload_files"]

# Dropped into CLOUDTRAIN_CHECKPOINT_DIR by the runtime Checkpointer, which publishes its own folders: the plain-script
# sync then leaves that directory alone (a folder being written or pruned by the Checkpointer is never half-published).
RUNTIME_MARKER = ".cloudtrain-runtime"
# Which job a checkpoint belongs to (set on every node by the plan: cloudtrain.bundle.staging.lineage_id); recorded in
# each manifest and checked at restore, so a job never resumes another job's checkpoints by accident.
LINEAGE_ENV = contract.LINEAGE
# Written there by the Checkpointer's rank 0 while its newest save is not published (removed once one is): the
# bootstrap's final sync reports it, so a job never ends "succeeded" with its last state only on a node's disk.
UNPUBLISHED_MARKER = ".cloudtrain-unpublished.json"
# Written there by the Checkpointer's local rank 0 before it loads a checkpoint (the one its node restored, or one it
# chose itself: an older one after a corrupt file, another store): which store and step, so that a node whose
# workers then fail knows what they were loading (cloudtrain/node/unloadable.py sets it aside).
LOADING_NOTE = ".cloudtrain-loading.json"
if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]


_print = log_line  # the default log of everything that publishes or restores checkpoints


def sha256_file(path: Path) -> str:
    return transfer.sha256_of(path)


class CheckpointNotPublished(CloudtrainError):
    """Checkpoints a job wrote that did not reach the store; the message says where their files still are."""


def _temp_objects(store: Any, prefix: str) -> list[str]:
    """Temp objects a killed uploader left under ``prefix`` (file:// only; object stores write atomically)."""
    list_temp = getattr(store, "list_temp", None)
    return list(list_temp(prefix)) if list_temp else []


def objects_by_step(uri: str, temp: bool = False, log: Log | None = None) -> dict[int, set[str]]:
    """step -> names of the objects under that step folder (relative); with ``temp``, stale temp files too.
    Only folders named as cloudtrain names them count: ``step-5/`` is not step 5 (``log`` says so once per folder
    that holds a manifest), so nothing read from or deleted in it is taken for a checkpoint's."""
    found: dict[int, set[str]] = {}
    base = uri.rstrip("/") + "/"
    store = storage.store_for(uri)
    listing = storage.with_retries(lambda: store.list(uri), f"listing {uri}")
    ignored: set[str] = set()
    for obj in [*listing, *(_temp_objects(store, uri) if temp else [])]:
        rel = obj[len(base):] if obj.startswith(base) else obj
        if rel.endswith("/"):  # a folder marker (S3 consoles, FUSE mounts make them): not a file, never ours
            continue
        head, _, rest = rel.partition("/")
        step = step_of(head)
        if step is not None and rest:
            found.setdefault(step, set()).add(rest)
        elif log and head.startswith("step-") and rest == MANIFEST and head not in ignored:
            ignored.add(head)
            log(f"{base}{head} is not a checkpoint folder (cloudtrain names them step-<9 digits>); ignored")
    return found


class Refused(NamedTuple):
    """A step folder with a manifest that is no checkpoint: ``kind`` corrupt or incomplete, and why."""

    step: int
    uri: str
    kind: str
    why: str
    digest: str = ""  # the manifest's, where it was read (a quarantine marker names it)


class Survey(NamedTuple):
    """What a store's step folders hold, oldest first: the checkpoints a restore may take, the ones that verify as
    listed but are set aside (set_aside.py; never restored, never deleted), and the rest with why each is none (a
    folder without a manifest is no checkpoint at all)."""

    complete: list[Checkpoint]
    set_aside: list[Checkpoint]
    refused: list[Refused]


def complete_among(uri: str, present: dict[int, set[str]], log: Log) -> list[Checkpoint]:
    return survey_among(uri, present, log).complete


def survey_among(uri: str, present: dict[int, set[str]], log: Log) -> Survey:
    store = storage.store_for(uri)
    complete: list[Checkpoint] = []
    aside: list[Checkpoint] = []
    refused: list[Refused] = []

    def skip(step: int, folder: str, kind: str, why: str, line: str, digest: str = "") -> None:
        refused.append(Refused(step, folder, kind, why, digest))
        log(line)

    for step, names in sorted(present.items()):
        if MANIFEST not in names:
            continue
        folder = storage.join(uri, step_dir(step))
        unsafe = sorted(n for n in names if not safe_relative(n))
        if unsafe:  # an object store can hold 'step-N/../x': such a folder is nobody's checkpoint
            why = f"object {unsafe[0]!r} escapes its folder"
            skip(step, folder, "corrupt", why, f"checkpoint {folder} is corrupt ({why}); skipped")
            continue
        # a read cut short must be retried, never taken as "no checkpoint" (retention would then delete it)
        data = storage.with_retries(functools.partial(store.read_bytes, storage.join(folder, MANIFEST)),
                                    f"reading {folder}/{MANIFEST}", log=log)
        digest = hashlib.sha256(data).hexdigest()
        try:
            manifest = safe_json.loads(data, "it")
            files = checked_files(manifest, step)
        except ValueError as exc:  # CorruptCheckpoint is a ValueError, safe_json.UnreadableJson too
            why = exc.message if isinstance(exc, safe_json.UnreadableJson) else str(exc)  # its fix is not this one's
            skip(step, folder, "corrupt", f"unusable manifest: {why}",
                 f"checkpoint {folder} has an unusable manifest ({why}); skipped", digest)
            continue
        if quarantine_name(digest) in names:
            skip(step, folder, "corrupt", "found corrupt by a restore",
                 f"checkpoint {folder} was found corrupt by an earlier restore; skipped", digest)
            continue
        missing = [f["path"] for f in files if f["path"] not in names]
        if missing:
            why = f"missing {len(missing)} file(s) ({missing[0]} ...)"
            skip(step, folder, "incomplete", why, f"checkpoint {folder} is {why}; skipped", digest)
            continue
        found = Checkpoint(step=step, uri=folder, manifest=manifest, digest=digest)
        # set aside: it verifies, but a start that restored it failed before any progress (restore says so)
        (aside if set_aside_name(digest) in names else complete).append(found)
    return Survey(complete, aside, refused)


def steps_present(uri: str) -> set[int]:
    """The step of every checkpoint folder under ``uri``, complete or not: a new checkpoint takes a higher one."""
    return set(objects_by_step(uri))


def list_complete(uri: str, log: Log = _print) -> list[Checkpoint]:
    """Checkpoints whose manifest exists, is well formed, lists only files that are present, was not found
    corrupt by a restore and is not set aside; oldest first. Anything else under ``uri`` is skipped with one line
    each (but a checkpoint set aside: restore.py says which it restores instead)."""
    return complete_among(uri, objects_by_step(uri, log=log), log)


def survey(uri: str, log: Log = _print) -> Survey:
    """``list_complete``, with the checkpoints set aside and those refused (`cloudtrain checkpoints`, the restore)."""
    return survey_among(uri, objects_by_step(uri, log=log), log)


def describe_files(root: Path, rel_paths: list[str]) -> list[dict[str, Any]]:
    digests = transfer.hash_many([root / rel for rel in rel_paths])  # several files at once
    return [{"path": rel, "size": (root / rel).stat().st_size, "sha256": digest}
            for rel, digest in zip(rel_paths, digests)]


def uploader(folder_uri: str, log: Log, immutable: bool = False) -> Callable[[Path, str], int]:
    """``upload(local, uri) -> bytes`` into the store of ``folder_uri``, with retries. ``immutable``: files nobody
    rewrites in place (the Checkpointer's own) may be linked into a file:// store, not copied."""
    store = storage.store_for(folder_uri)
    put = getattr(store, "link_file", store.put_file) if immutable else store.put_file
    check = writer.checker(folder_uri)  # one live job writes to a checkpoint URI (writer.py)

    def upload(source: Path, target: str) -> int:
        check()
        return int(storage.with_retries(functools.partial(put, source, target), f"upload of {target}", log=log))

    return upload


def _upload_each(root: Path, rel_paths: list[str], folder_uri: str, log: Log, hash_files: bool,
                 immutable: bool = False) -> tuple[int, list[str]]:
    items = [(root / rel, storage.join(folder_uri, rel)) for rel in rel_paths]
    return transfer.upload_many(items, uploader(folder_uri, log, immutable), hash_files=hash_files)


def upload_files(root: Path, files: list[dict[str, Any]], folder_uri: str, log: Log = _print) -> int:
    """Upload files (as described by ``describe_files``), several at once, with retries; returns bytes uploaded."""
    return _upload_each(root, [entry["path"] for entry in files], folder_uri, log, hash_files=False)[0]


def copy_files(source_uri: str, files: list[dict[str, Any]], folder_uri: str, log: Log = _print) -> int:
    """Files the store already holds under ``source_uri`` (another node's part) into ``folder_uri``, copied by the
    store itself (``storage.copier``): their bytes never pass through this node. Several at once, with retries;
    each copy's size is checked against its description. Returns the bytes copied."""
    copy = storage.copier(folder_uri)
    if copy is None:
        raise CloudtrainError(f"the store of {folder_uri} cannot copy objects itself",
                              remedy="carry the files from a local copy (upload_files)")
    writer.check(folder_uri)

    def one(entry: dict[str, Any]) -> int:
        source, target = storage.join(source_uri, entry["path"]), storage.join(folder_uri, entry["path"])
        size = int(storage.with_retries(functools.partial(copy, source, target), f"copy of {source} to {target}",
                                        log=log))
        if size != int(entry["size"]):
            raise CloudtrainError(f"the copy {target} holds {size} bytes, its description {entry['size']}",
                                  remedy="the source changed after it was described: publish it again")
        return size

    with ThreadPoolExecutor(max(1, min(transfer.threads(), len(files))), thread_name_prefix="cloudtrain-copy") as pool:
        return sum(pool.map(one, files))


def carry_files(source: Path | str, files: list[dict[str, Any]], folder_uri: str, log: Log = _print) -> int:
    """``upload_files`` from a local folder, or ``copy_files`` from a folder in the store (a URI)."""
    if isinstance(source, Path):
        return upload_files(source, files, folder_uri, log=log)
    return copy_files(source, files, folder_uri, log=log)


def describe_and_upload(root: Path, rel_paths: list[str], folder_uri: str, log: Log = _print,
                        immutable: bool = False) -> list[dict[str, Any]]:
    """``describe_files`` and ``upload_files`` at once: each file is hashed while the uploads run (from the page
    cache: it was just written), not in a pass of its own before them. ``immutable``: the files are never rewritten
    in place (a new file replaces one), so a file:// store on the same file system may hard-link them."""
    sizes = [(root / rel).stat().st_size for rel in rel_paths]
    _, digests = _upload_each(root, rel_paths, folder_uri, log, hash_files=True, immutable=immutable)
    return [{"path": rel, "size": size, "sha256": digest} for rel, size, digest in zip(rel_paths, sizes, digests)]


def publish(folder_uri: str, step: int, files: list[dict[str, Any]], *, world_size: int, kind: str = "full",
            extra: dict[str, Any] | None = None, log: Log = _print) -> None:
    """Write the manifest, LAST: from this moment the checkpoint exists. A quarantine marker left by an earlier,
    corrupt checkpoint of the same step names that manifest's digest, so it does not apply to this one."""
    manifest = {"step": step, "kind": kind, "world_size": world_size, "created": time.time(),
                "files": sorted(files, key=lambda f: f["path"]), **(extra or {})}
    if os.environ.get(LINEAGE_ENV):
        manifest.setdefault("lineage", os.environ[LINEAGE_ENV])
    data = json.dumps(manifest, indent=1).encode()
    writer.check(folder_uri)  # this job still holds its checkpoint URI (never taken over since the uploads began)
    store = storage.store_for(folder_uri)
    stale = _temp_objects(store, folder_uri)  # every rank's upload is done: any temp file is a killed attempt's
    if stale:
        store.delete(stale)
    storage.with_retries(lambda: store.write_bytes(storage.join(folder_uri, MANIFEST), data),
                         f"publishing {folder_uri}", log=log)


def quarantine(checkpoint: Checkpoint, reason: str, log: Log = _print) -> None:
    """Record in the store that this checkpoint (this very manifest) failed verification: every later listing, in
    any process (retention runs where the next save happens), skips it. Best effort: a read-only store only means
    the next restore verifies it again."""
    marker = storage.join(checkpoint.uri, quarantine_name(checkpoint.digest))
    body = json.dumps({"reason": reason, "manifest_sha256": checkpoint.digest, "found_at": time.time(),
                       "found_by": socket.gethostname()}, indent=1).encode()
    try:
        storage.with_retries(lambda: storage.write_bytes(marker, body), f"marking {checkpoint.uri} corrupt",
                             attempts=2)
    except CloudtrainError as exc:
        log(f"could not mark {checkpoint.uri} as corrupt in the store ({exc.__cause__}); the next restore checks "
            "it again")


def runtime_unpublished(local_root: Path) -> str | None:
    """What the Checkpointer left unpublished in ``local_root`` (its own account, UNPUBLISHED_MARKER), if anything."""
    try:
        return str(safe_json.load(local_root / UNPUBLISHED_MARKER)["error"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: safe_json.UnreadableJson
        return f"the Checkpointer left {local_root / UNPUBLISHED_MARKER}, unreadable: its newest save is not published"


def mark_unpublished(local_root: Path, step: int, message: str) -> None:
    """The Checkpointer's account of a save it could not publish (UNPUBLISHED_MARKER), for the node's final sync:
    the job cannot end "succeeded" with its state only on a node's disk. Best effort (a full disk refuses it)."""
    with contextlib.suppress(OSError):
        (local_root / UNPUBLISHED_MARKER).write_text(json.dumps({"step": step, "error": message}))


def mark_published(local_root: Path) -> None:
    """A save is published: an earlier one's UNPUBLISHED_MARKER no longer holds."""
    (local_root / UNPUBLISHED_MARKER).unlink(missing_ok=True)


def note_loading(local_root: Path, uri: str, step: int) -> None:
    """The Checkpointer's account of the checkpoint it is about to load (LOADING_NOTE). Best effort."""
    with contextlib.suppress(OSError):
        (local_root / LOADING_NOTE).write_text(json.dumps({"uri": uri, "step": step, "at": time.time()}))


def forget_loading(local_root: Path) -> None:
    """A save is published after a load: the run made progress, so what it loaded is no longer in doubt."""
    with contextlib.suppress(OSError):
        (local_root / LOADING_NOTE).unlink(missing_ok=True)


def loading_noted(local_root: Path) -> tuple[str, int] | None:
    """(store URI, step) the Checkpointer in this folder last started to load, or None."""
    try:
        note = safe_json.load(local_root / LOADING_NOTE)
        uri, step = note["uri"], note["step"]
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: safe_json.UnreadableJson
        return None
    return (uri, step) if isinstance(uri, str) and isinstance(step, int) and not isinstance(step, bool) else None
