"""The checkpoint protocol, shared by the in-job Checkpointer, the bootstrap's restore and the plain-script sync.
No torch here: it moves and verifies files.

A checkpoint is ``<uri>/step-<N>/`` plus ``manifest.json`` written LAST (step, kind, world size, every file with
its size and sha256). Without its manifest a folder does not exist. Restore takes the newest checkpoint whose
files all verify; a corrupt or partial one is skipped with a warning, never loaded, and a corrupt one is marked in
the store (``quarantine-<manifest digest>.json``) so that retention, in whatever process runs it later, does not
count it. Retention keeps the newest K complete checkpoints and never deletes the newest one that verifies; local
deletes are never mirrored to the bucket. Nothing the store holds decides where a restore writes: manifest paths
are checked before anything is downloaded, and files land in a staging folder beside the target folder, which
receives only checkpoints that verified.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import contract, storage
from cloudtrain.checkpoint.download import Restored, download, log_line
from cloudtrain.checkpoint.manifest import (
    MANIFEST,
    QUARANTINE_PREFIX,
    Checkpoint,
    CorruptCheckpoint,
    checked_files,
    is_dir_layout,
    quarantine_name,
    safe_relative,
    step_dir,
    step_of,
)
from cloudtrain.errors import CloudtrainError
from cloudtrain.storage import transfer
from cloudtrain.storage.paths import is_within

__all__ = ["MANIFEST", "RUNTIME_MARKER", "UNPUBLISHED_MARKER", "Checkpoint", "CheckpointNotPublished",
           "CorruptCheckpoint", "Restored", "apply_retention", "describe_and_upload", "describe_files", "download",
           "list_complete", "publish", "restore_latest", "sha256_file", "step_dir", "sync_dir", "upload_files"]

# Dropped into CLOUDTRAIN_CHECKPOINT_DIR by the runtime Checkpointer, which publishes its own folders: the plain-script
# sync then leaves that directory alone (a folder being written or pruned by the Checkpointer is never half-published).
RUNTIME_MARKER = ".cloudtrain-runtime"
# Which job a checkpoint belongs to (set on every node by the plan: cloudtrain.bundle.staging.lineage_id); recorded in
# each
# manifest and checked at restore, so a job never resumes another job's checkpoints by accident.
LINEAGE_ENV = contract.LINEAGE
# Written there by the Checkpointer's rank 0 while its newest save is not published (removed once one is): the
# bootstrap's final sync reports it, so a job never ends "succeeded" with its last state only on a node's disk.
UNPUBLISHED_MARKER = ".cloudtrain-unpublished.json"
if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]
    Judge = Callable[[Path, bool], "tuple[str | None, list[tuple[Path, list[dict[str, Any]]]]]"]


_print = log_line  # the default log of everything that publishes or restores checkpoints


def sha256_file(path: Path) -> str:
    return transfer.sha256_of(path)


class CheckpointNotPublished(CloudtrainError):
    """Checkpoints a job wrote that did not reach the store; the message says where their files still are."""


def _temp_objects(store: Any, prefix: str) -> list[str]:
    """Temp objects a killed uploader left under ``prefix`` (file:// only; object stores write atomically)."""
    list_temp = getattr(store, "list_temp", None)
    return list(list_temp(prefix)) if list_temp else []


def _steps_present(uri: str, temp: bool = False, log: Log | None = None) -> dict[int, set[str]]:
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


def _complete(uri: str, present: dict[int, set[str]], log: Log) -> list[Checkpoint]:
    store = storage.store_for(uri)
    complete = []
    for step, names in sorted(present.items()):
        if MANIFEST not in names:
            continue
        folder = storage.join(uri, step_dir(step))
        unsafe = sorted(n for n in names if not safe_relative(n))
        if unsafe:  # an object store can hold 'step-N/../x': such a folder is nobody's checkpoint
            log(f"checkpoint {folder} is corrupt (object {unsafe[0]!r} escapes its folder); skipped")
            continue
        # a read cut short must be retried, never taken as "no checkpoint" (retention would then delete it)
        data = storage.with_retries(functools.partial(store.read_bytes, storage.join(folder, MANIFEST)),
                                    f"reading {folder}/{MANIFEST}", log=log)
        digest = hashlib.sha256(data).hexdigest()
        try:
            manifest = json.loads(data)
            files = checked_files(manifest, step)
        except (ValueError, RecursionError) as exc:  # CorruptCheckpoint is a ValueError, json's errors too
            log(f"checkpoint {folder} has an unusable manifest ({exc}); skipped")
            continue
        if quarantine_name(digest) in names:
            log(f"checkpoint {folder} was found corrupt by an earlier restore; skipped")
            continue
        missing = [f["path"] for f in files if f["path"] not in names]
        if missing:
            log(f"checkpoint {folder} is missing {len(missing)} file(s) ({missing[0]} ...); skipped")
            continue
        complete.append(Checkpoint(step=step, uri=folder, manifest=manifest, digest=digest))
    return complete


def steps_present(uri: str) -> set[int]:
    """The step of every checkpoint folder under ``uri``, complete or not: a new checkpoint takes a higher one."""
    return set(_steps_present(uri))


def list_complete(uri: str, log: Log = _print) -> list[Checkpoint]:
    """Checkpoints whose manifest exists, is well formed, lists only files that are present and was not found
    corrupt by a restore; oldest first. Anything else under ``uri`` is skipped with one line each."""
    return _complete(uri, _steps_present(uri, log=log), log)


def describe_files(root: Path, rel_paths: list[str]) -> list[dict[str, Any]]:
    digests = transfer.hash_many([root / rel for rel in rel_paths])  # several files at once
    return [{"path": rel, "size": (root / rel).stat().st_size, "sha256": digest}
            for rel, digest in zip(rel_paths, digests)]


def _upload_each(root: Path, rel_paths: list[str], folder_uri: str, log: Log, hash_files: bool,
                 immutable: bool = False) -> tuple[int, list[str]]:
    store = storage.store_for(folder_uri)
    # files nobody rewrites in place (the Checkpointer's own) may be linked into a file:// store, not copied
    put = getattr(store, "link_file", store.put_file) if immutable else store.put_file

    def upload(source: Path, target: str) -> int:
        return storage.with_retries(functools.partial(put, source, target), f"upload of {target}", log=log)

    items = [(root / rel, storage.join(folder_uri, rel)) for rel in rel_paths]
    return transfer.upload_many(items, upload, hash_files=hash_files)


def upload_files(root: Path, files: list[dict[str, Any]], folder_uri: str, log: Log = _print) -> int:
    """Upload files (as described by ``describe_files``), several at once, with retries; returns bytes uploaded."""
    return _upload_each(root, [entry["path"] for entry in files], folder_uri, log, hash_files=False)[0]


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


def apply_retention(uri: str, keep: int, log: Log = _print) -> list[int]:
    """Delete all but the newest ``keep`` (>= 1 enforced; >= 2 by spec) complete checkpoints, and other step
    folders (partial, unusable, found corrupt) older than the newest complete one. A manifest is deleted before its
    files, so a half-deleted checkpoint is never mistaken for a complete one. Only checkpoints that verify as far
    as cloudtrain has seen count: one found corrupt is never among the ``keep``, and what is newer than the newest
    complete checkpoint is left alone (it may be in flight, or be published again). Returns the steps removed."""
    keep = max(keep, 1)
    present = _steps_present(uri, temp=True)
    complete = _complete(uri, present, log=lambda _m: None)
    if not complete:
        return []
    kept = complete[-keep:]
    keep_steps = {c.step for c in kept}
    newest = complete[-1].step
    store = storage.store_for(uri)
    removed = []
    for step, names in sorted(present.items()):
        folder = storage.join(uri, step_dir(step))
        ours = sorted(n for n in names if safe_relative(n))  # never a delete outside the folder
        if step in keep_steps:  # markers of a corrupt checkpoint this step replaced: no longer true
            current = next(quarantine_name(c.digest) for c in kept if c.step == step)
            stale = [n for n in ours if n.startswith(QUARANTINE_PREFIX) and n != current]
            if stale:
                store.delete([storage.join(folder, n) for n in stale])
            continue
        if step >= newest:
            continue
        if MANIFEST in ours:
            store.delete([storage.join(folder, MANIFEST)])
        store.delete([storage.join(folder, n) for n in ours if n != MANIFEST])
        prune = getattr(store, "prune_empty", None)  # file://: no empty step folder left behind
        if prune:
            prune(folder)
        removed.append(step)
    if removed:
        log(f"retention: removed step(s) {removed} under {uri}, kept {sorted(keep_steps)}")
    return removed


def _restored_already(target: Path, checkpoint: Checkpoint) -> bool:
    try:
        return bool(json.loads((target / MANIFEST).read_text()) == checkpoint.manifest)
    except (OSError, ValueError, RecursionError):
        return False


def check_lineage(uri: str, candidates: list[Checkpoint]) -> None:
    """Refuse to resume from checkpoints another job wrote (a different lineage recorded in their manifests).
    Manifests without a lineage (written before it existed) are accepted."""
    mine = os.environ.get(LINEAGE_ENV)
    theirs = {str(c.manifest["lineage"]) for c in candidates if c.manifest.get("lineage")}
    if mine and theirs and mine not in theirs:
        raise CloudtrainError(f"the checkpoints under {uri} belong to another job (lineage {', '.join(sorted(theirs))}"
                              f", this job is {mine}): not resuming from them",
                              remedy="give this job its own checkpoint.uri; to continue that job on purpose, set "
                                     f"env {LINEAGE_ENV} to its lineage")


def restore_latest(uri: str, local_root: Path, log: Log = _print, earlier: list[Path] | None = None,
                   moved: list[Restored] | None = None, refused: list[str] | None = None) -> Checkpoint | None:
    """Bring the newest checkpoint that verifies to ``local_root/step-<N>``; fall back to older ones, saying so.
    A checkpoint that does not verify is marked in the store (``quarantine``). Files this node already holds of it
    (in ``local_root`` or the ``earlier`` folders: what an earlier run on this machine left) are verified against
    the manifest and used instead of downloads. With ``moved``, what was moved is appended there and the caller
    says it (the node's one line), else it is logged here. With ``refused``, why each checkpoint it could not use
    failed is appended there."""
    candidates = list_complete(uri, log=log)
    check_lineage(uri, candidates)
    for checkpoint in reversed(candidates):
        snapshot = is_dir_layout(checkpoint.manifest)  # a stack's own layout: back under the names it wrote
        target = local_root if snapshot else local_root / step_dir(checkpoint.step)
        if not snapshot and _restored_already(target, checkpoint):
            return checkpoint  # already here (the bootstrap restored it before the job started)
        try:
            done = download(checkpoint, target, log=log, earlier=earlier)
        except CorruptCheckpoint as exc:
            log(f"checkpoint {checkpoint.uri} is corrupt ({exc}); falling back to the previous one")
            quarantine(checkpoint, str(exc), log=log)
            (refused if refused is not None else []).append(f"{checkpoint.uri} is corrupt ({exc})")
            continue
        except (OSError, CloudtrainError) as exc:
            log(f"checkpoint {checkpoint.uri} could not be downloaded ({exc}); falling back to the previous one")
            (refused if refused is not None else []).append(f"{checkpoint.uri} could not be downloaded ({exc})")
            continue
        if moved is None:
            log(f"restored {checkpoint.uri} to {target} ({done.summary()})")
        else:
            moved.append(done)
        return checkpoint
    if candidates:
        log(f"no checkpoint under {uri} verified; starting from scratch")
    return None


def sync_dir(local_root: Path, uri: str, *, final: bool, keep: int = contract.MIN_KEEP,
             log: Log = _print, judge: Judge | None = None) -> list[int]:
    """Publish the ``step-<N>`` folders a plain script wrote into CLOUDTRAIN_CHECKPOINT_DIR.

    A folder is complete once a newer one exists, or at exit (``final``). A directory the runtime Checkpointer
    writes (``RUNTIME_MARKER``) publishes itself and is skipped whole; restored or already published folders carry
    a manifest and are skipped. Like SageMaker's /opt/ml/checkpoints, but complete folders only, and local deletes
    are never mirrored to the bucket. Returns the steps published; raises CheckpointNotPublished (saying which
    steps and where their files are) when a folder could not be published. ``judge(folder, final)`` (the node's
    sync): why a folder is no checkpoint (yet), or None and the files other nodes wrote into it, as
    ``(their folder, their descriptions)`` pairs; a folder it turns down stays unpublished.
    """
    if (local_root / RUNTIME_MARKER).exists():
        return []
    found = sorted((step, p) for p in local_root.glob("step-*")
                   if p.is_dir() and (step := step_of(p.name, canonical=False)) is not None)
    ready = [(step, folder) for step, folder in (found if final else found[:-1])
             if not (folder / MANIFEST).exists()]  # restored, or published already (a dcp.save folder is welcome)
    published = []
    for step, folder in ready:
        why, others = judge(folder, final) if judge is not None else (None, [])
        if why is not None:
            continue
        try:
            rel = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            files = describe_files(folder, rel)
            remote = storage.join(uri, step_dir(step))
            upload_files(folder, files, remote, log=log)
            for root, theirs in others:  # a name this node holds too is this node's file
                theirs = [f for f in theirs if f["path"] not in {mine["path"] for mine in files}]
                upload_files(root, theirs, remote, log=log)
                files += theirs
            publish(remote, step, files, world_size=0, kind="files", log=log)
        except (CloudtrainError, OSError) as exc:
            left = [f.name for s, f in ready if s not in published]
            why = exc.message if isinstance(exc, CloudtrainError) else str(exc)
            raise CheckpointNotPublished(
                f"checkpoint folder(s) {left} not published to {uri}: {why}; the files are still in {local_root}",
                remedy="check that the checkpoint store is writable and reachable from the job") from exc
        try:  # this node's note that the folder is published: a disk the checkpoints filled may refuse it
            (folder / MANIFEST).write_text(json.dumps({"step": step, "published": remote}))
        except OSError as exc:  # the checkpoint stands in the store; without the note a later pass publishes it again
            log(f"warning: published {remote}, but cannot note it in {folder} ({exc.strerror or exc}): free space "
                f"on the disk holding {local_root}, or keep fewer checkpoints (checkpoint.keep)")
        published.append(step)
    if published:
        log(f"published plain-script checkpoint(s) {published} to {uri}")
        try:  # the checkpoints stand; what retention misses now, the next publish's retention removes
            apply_retention(uri, keep, log=log)
        except (CloudtrainError, OSError) as exc:
            log(f"retention under {uri} failed ({exc}); the next publish tries again")
    return published


def runtime_unpublished(local_root: Path) -> str | None:
    """What the Checkpointer left unpublished in ``local_root`` (its own account, UNPUBLISHED_MARKER), if anything."""
    try:
        return str(json.loads((local_root / UNPUBLISHED_MARKER).read_text())["error"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return f"the Checkpointer left {local_root / UNPUBLISHED_MARKER}, unreadable: its newest save is not published"


def _overlaps(uri: str, local_root: Path) -> bool:
    if not uri.startswith("file://"):
        return False
    store, local = storage.local_path(uri).resolve(), local_root.resolve()
    return is_within(store, local) or is_within(local, store)


def _report(result: dict[str, Any], code: int) -> int:
    """One JSON line on stdout, read by the bootstrap (which logs ``error`` and puts it in the node's status)."""
    print(json.dumps(result), flush=True)
    return code


def restore_report(uri: str, local: Path, earlier: list[Path] | None = None) -> dict[str, Any]:
    """The node's restore, before its workers start (the bootstrap, through cloudtrain.node.steps, or
    ``python -m cloudtrain.checkpoint.store restore``): ``{"step": N or None, "error": why or None}``."""
    if _overlaps(uri, local):
        _print(f"warning: the checkpoint URI {uri} and CLOUDTRAIN_CHECKPOINT_DIR {local} are the same folder (or "
               "one holds the other): the store then holds the script's own folders too; give the checkpoint "
               "URI a folder of its own")
    try:
        moved: list[Restored] = []
        refused: list[str] = []
        found = restore_latest(uri, local, earlier=earlier, moved=moved, refused=refused)
    except CloudtrainError as exc:  # unreadable store, or another job's checkpoints: the node stops, saying why
        return {"step": None, "error": f"{exc.message}; {exc.remedy}" if exc.remedy else exc.message}
    entries = found.manifest.get("entries") if found and is_dir_layout(found.manifest) else None
    return {"step": found.step if found else None, "error": None, "entries": entries,
            "moved": moved[0].summary() if moved else None, "refused": refused}


def main(argv: list[str] | None = None) -> int:
    """What the bootstrap runs around torchrun (each prints one JSON line; ``error`` and exit 1 on failure):

    ``python -m cloudtrain.checkpoint.store restore URI DIR``           before the workers start
    ``python -m cloudtrain.checkpoint.store sync DIR URI [--every S]``   while they run (node 0)
    ``python -m cloudtrain.checkpoint.store sync DIR URI --final``       after they exited (node 0)
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "restore":
        report = restore_report(args[1], Path(args[2]))
        return _report(report, 1) if report["error"] else _report({"step": report["step"]}, 0)
    if len(args) >= 3 and args[0] == "sync":
        local, uri, rest = Path(args[1]), args[2], args[3:]
        keep = contract.keep_count(os.environ.get(contract.CHECKPOINT_KEEP))
        if "--final" in rest:
            try:
                published = sync_dir(local, uri, final=True, keep=keep)
            except CloudtrainError as exc:
                return _report({"published": [], "error": str(exc)}, 1)
            unpublished = runtime_unpublished(local) if (local / RUNTIME_MARKER).exists() else None
            return _report({"published": published, "error": unpublished}, 1 if unpublished else 0)
        every = float(rest[rest.index("--every") + 1]) if "--every" in rest else contract.SYNC_EVERY
        while True:
            try:
                sync_dir(local, uri, final=False, keep=keep)
            except CloudtrainError as exc:  # the final sync tries again and decides the job's outcome
                _print(f"warning: {exc}; trying again in {every:.0f}s")
            time.sleep(every)
    print("usage: python -m cloudtrain.checkpoint.store restore URI DIR | sync DIR URI [--every S | --final]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
