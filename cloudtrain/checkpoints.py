"""The checkpoint protocol, shared by the in-job Checkpointer, the bootstrap's restore and the plain-script sync.
No torch here: it moves and verifies files.

A checkpoint is ``<uri>/step-<N>/`` plus ``manifest.json`` written LAST (step, kind, world size, every file with
its size and sha256). Without its manifest a folder does not exist. Restore takes the newest checkpoint whose
files all verify; a corrupt or partial one is skipped with a warning, never loaded. Retention keeps the newest K
complete checkpoints and never deletes the last complete one; local deletes are never mirrored to the bucket.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import storage
from cloudtrain.errors import CloudtrainError

MANIFEST = "manifest.json"
# Dropped into CLOUDTRAIN_CHECKPOINT_DIR by the runtime Checkpointer, which publishes its own folders: the plain-script
# sync then leaves that directory alone (a folder being written or pruned by the Checkpointer is never half-published).
RUNTIME_MARKER = ".cloudtrain-runtime"
# Which job a checkpoint belongs to (set on every node by the plan: cloudtrain.staging.lineage_id); recorded in each
# manifest and checked at restore, so a job never resumes another job's checkpoints by accident.
LINEAGE_ENV = "CLOUDTRAIN_LINEAGE"
_STEP_DIR = re.compile(r"^step-(\d+)$")
if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]


def _print(message: str) -> None:
    print(f"[cloudtrain] {message}", file=sys.stderr, flush=True)


def step_dir(step: int) -> str:
    return f"step-{step:09d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    step: int
    uri: str  # the step folder
    manifest: dict[str, Any]


def _temp_objects(store: Any, prefix: str) -> list[str]:
    """Temp objects a killed uploader left under ``prefix`` (file:// only; object stores write atomically)."""
    list_temp = getattr(store, "list_temp", None)
    return list(list_temp(prefix)) if list_temp else []


def _steps_present(uri: str, temp: bool = False) -> dict[int, set[str]]:
    """step -> names of the objects under that step folder (relative); with ``temp``, stale temp files too."""
    found: dict[int, set[str]] = {}
    base = uri.rstrip("/") + "/"
    store = storage.store_for(uri)
    listing = storage.with_retries(lambda: store.list(uri), f"listing {uri}")
    for obj in [*listing, *(_temp_objects(store, uri) if temp else [])]:
        rel = obj[len(base):] if obj.startswith(base) else obj
        head, _, rest = rel.partition("/")
        match = _STEP_DIR.match(head)
        if match and rest:
            found.setdefault(int(match.group(1)), set()).add(rest)
    return found


def list_complete(uri: str, log: Log = _print) -> list[Checkpoint]:
    """Checkpoints whose manifest exists, parses and lists only files that are present, oldest first."""
    store = storage.store_for(uri)
    complete = []
    for step, names in sorted(_steps_present(uri).items()):
        if MANIFEST not in names:
            continue
        folder = storage.join(uri, step_dir(step))
        try:
            # a read cut short must be retried, never taken as "no checkpoint" (retention would then delete it)
            data = storage.with_retries(functools.partial(store.read_bytes, storage.join(folder, MANIFEST)),
                                        f"reading {folder}/{MANIFEST}", log=log)
            manifest = json.loads(data)
            missing = [f["path"] for f in manifest["files"] if f["path"] not in names]
        except (ValueError, KeyError, TypeError) as exc:
            log(f"checkpoint {folder} has an unreadable manifest ({exc}); skipped")
            continue
        if missing:
            log(f"checkpoint {folder} is missing {len(missing)} file(s) ({missing[0]} ...); skipped")
            continue
        complete.append(Checkpoint(step=step, uri=folder, manifest=manifest))
    return complete


def describe_files(root: Path, rel_paths: list[str]) -> list[dict[str, Any]]:
    return [{"path": rel, "size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)} for rel in rel_paths]


def upload_files(root: Path, files: list[dict[str, Any]], folder_uri: str, log: Log = _print) -> int:
    """Upload files (as described by ``describe_files``) with retries; returns bytes uploaded."""
    store = storage.store_for(folder_uri)
    total = 0
    for entry in files:
        source, target = root / entry["path"], storage.join(folder_uri, entry["path"])
        total += storage.with_retries(functools.partial(store.put_file, source, target), f"upload of {target}",
                                      log=log)
    return total


def publish(folder_uri: str, step: int, files: list[dict[str, Any]], *, world_size: int, kind: str = "full",
            extra: dict[str, Any] | None = None, log: Log = _print) -> None:
    """Write the manifest, LAST: from this moment the checkpoint exists."""
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


def apply_retention(uri: str, keep: int, log: Log = _print) -> list[int]:
    """Delete all but the newest ``keep`` (>= 1 enforced; >= 2 by spec) complete checkpoints, and partial folders
    older than the newest complete one. A manifest is deleted before its files, so a half-deleted checkpoint is
    never mistaken for a complete one. Returns the steps removed."""
    keep = max(keep, 1)
    complete = list_complete(uri, log=lambda _m: None)
    if not complete:
        return []
    keep_steps = {c.step for c in complete[-keep:]}
    newest = complete[-1].step
    store = storage.store_for(uri)
    removed = []
    for step, names in sorted(_steps_present(uri, temp=True).items()):
        if step in keep_steps or step >= newest:
            continue  # never the kept ones, never anything newer than the newest complete (may be in flight)
        folder = storage.join(uri, step_dir(step))
        if MANIFEST in names:
            store.delete([storage.join(folder, MANIFEST)])
        store.delete([storage.join(folder, n) for n in sorted(names) if n != MANIFEST])
        removed.append(step)
    if removed:
        log(f"retention: removed step(s) {removed} under {uri}, kept {sorted(keep_steps)}")
    return removed


def download(checkpoint: Checkpoint, target: Path) -> None:
    """Download and verify every file; raise ValueError on a size or digest mismatch."""
    store = storage.store_for(checkpoint.uri)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for entry in checkpoint.manifest["files"]:
        local = partial / entry["path"]
        source = storage.join(checkpoint.uri, entry["path"])
        storage.with_retries(functools.partial(store.get_file, source, local), f"download of {source}")
        if local.stat().st_size != entry["size"] or sha256_file(local) != entry["sha256"]:
            raise ValueError(f"{entry['path']} does not match its manifest (size or sha256)")
    (partial / MANIFEST).write_text(json.dumps(checkpoint.manifest, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


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


def restore_latest(uri: str, local_root: Path, log: Log = _print) -> Checkpoint | None:
    """Bring the newest checkpoint that verifies to ``local_root/step-<N>``; fall back to older ones, saying so."""
    candidates = list_complete(uri, log=log)
    check_lineage(uri, candidates)
    for checkpoint in reversed(candidates):
        target = local_root / step_dir(checkpoint.step)
        if (target / MANIFEST).is_file() and json.loads((target / MANIFEST).read_text()) == checkpoint.manifest:
            return checkpoint  # already here (the bootstrap restored it before the job started)
        try:
            download(checkpoint, target)
        except (ValueError, OSError, CloudtrainError) as exc:
            log(f"checkpoint {checkpoint.uri} is corrupt ({exc}); falling back to the previous one")
            continue
        log(f"restored {checkpoint.uri} to {target}")
        return checkpoint
    if candidates:
        log(f"no checkpoint under {uri} verified; starting from scratch")
    return None


def sync_dir(local_root: Path, uri: str, *, final: bool, keep: int = 2, log: Log = _print) -> list[int]:
    """Publish the ``step-<N>`` folders a plain script wrote into CLOUDTRAIN_CHECKPOINT_DIR.

    A folder is complete once a newer one exists, or at exit (``final``). A directory the runtime Checkpointer
    writes (``RUNTIME_MARKER``) publishes itself and is skipped whole; restored or already published folders carry
    a manifest and are skipped. Like SageMaker's /opt/ml/checkpoints, but complete folders only, and local deletes
    are never mirrored to the bucket. Returns the steps published.
    """
    if (local_root / RUNTIME_MARKER).exists():
        return []
    found = sorted((int(m.group(1)), p) for p in local_root.glob("step-*")
                   if p.is_dir() and (m := _STEP_DIR.match(p.name)))
    ready = found if final else found[:-1]
    published = []
    for step, folder in ready:
        if (folder / MANIFEST).exists():  # restored, or published already (a DCP folder from dcp.save is welcome)
            continue
        rel = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        files = describe_files(folder, rel)
        remote = storage.join(uri, step_dir(step))
        upload_files(folder, files, remote, log=log)
        publish(remote, step, files, world_size=0, kind="files", log=log)
        (folder / MANIFEST).write_text(json.dumps({"step": step, "published": remote}))
        published.append(step)
    if published:
        log(f"published plain-script checkpoint(s) {published} to {uri}")
        apply_retention(uri, keep, log=log)
    return published


def main(argv: list[str] | None = None) -> int:
    """What the bootstrap runs around torchrun:

    ``python -m cloudtrain.checkpoints restore URI DIR``           before the workers start
    ``python -m cloudtrain.checkpoints sync DIR URI [--every S]``   while they run (node 0)
    ``python -m cloudtrain.checkpoints sync DIR URI --final``       after they exited (node 0)
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "restore":
        try:
            found = restore_latest(args[1], Path(args[2]))
        except CloudtrainError as exc:  # another job's checkpoints: the node stops before training, saying why
            _print(f"error: {exc.message}; {exc.remedy}")
            return 2
        print(json.dumps({"step": found.step if found else None}))
        return 0
    if len(args) >= 3 and args[0] == "sync":
        local, uri, rest = Path(args[1]), args[2], args[3:]
        keep = int(os.environ.get("CLOUDTRAIN_CHECKPOINT_KEEP", "2"))
        if "--final" in rest:
            sync_dir(local, uri, final=True, keep=keep)
            return 0
        every = float(rest[rest.index("--every") + 1]) if "--every" in rest else 60.0
        while True:
            sync_dir(local, uri, final=False, keep=keep)
            time.sleep(every)
    print("usage: python -m cloudtrain.checkpoints restore URI DIR | sync DIR URI [--every S | --final]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
