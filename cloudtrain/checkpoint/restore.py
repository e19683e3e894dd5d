"""Restore: bring the newest checkpoint that verifies from a store to a node's folder (stdlib only).

Restore takes the newest checkpoint whose files all verify; a corrupt or partial one is skipped with a warning,
never loaded, and a corrupt one is marked in the store (store.quarantine); one set aside (set_aside.py: a start
that restored it failed before any progress) is passed over, and said. Nothing the store holds decides where a
restore writes: manifest paths are checked before anything is downloaded, and files land in a staging folder beside
the target folder (download.py), which receives only checkpoints that verified. A job never resumes another job's
checkpoints by accident: the lineage each manifest records is checked first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import safe_json, storage
from cloudtrain.checkpoint import set_aside
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.download import Restored, download, log_line
from cloudtrain.checkpoint.manifest import (
    MANIFEST,
    Checkpoint,
    CorruptCheckpoint,
    is_dir_layout,
    shards_on_demand,
    step_dir,
)
from cloudtrain.errors import CloudtrainError
from cloudtrain.storage.paths import is_within

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]

_print = log_line


def _restored_already(target: Path, checkpoint: Checkpoint) -> bool:
    try:
        return bool(safe_json.load(target / MANIFEST) == checkpoint.manifest)
    except (OSError, ValueError):  # none there, or not a manifest (safe_json.UnreadableJson)
        return False


def check_lineage(uri: str, candidates: list[Checkpoint]) -> None:
    """Refuse to resume from checkpoints another job wrote (a different lineage recorded in their manifests).
    Manifests without a lineage (written before it existed) are accepted."""
    mine = os.environ.get(checkpoint_store.LINEAGE_ENV)
    theirs = {str(c.manifest["lineage"]) for c in candidates if c.manifest.get("lineage")}
    if mine and theirs and mine not in theirs:
        raise CloudtrainError(f"the checkpoints under {uri} belong to another job (lineage {', '.join(sorted(theirs))}"
                              f", this job is {mine}): not resuming from them",
                              remedy="give this job its own checkpoint.uri; to continue that job on purpose, set "
                                     f"env {checkpoint_store.LINEAGE_ENV} to its lineage")


def _say_set_aside(uri: str, found: checkpoint_store.Survey, log: Log) -> list[set_aside.Aside]:
    """The checkpoints set aside that are newer than every usable one (a restore takes an older one instead, or
    starts from scratch), each said with why; returned newest first."""
    newest = found.complete[-1].step if found.complete else -1
    skipped = [set_aside.read(c) for c in reversed(found.set_aside) if c.step > newest]
    instead = f"restoring checkpoint {newest}" if found.complete else "no checkpoint before it; starting from scratch"
    for i, aside in enumerate(skipped):
        log(f"checkpoint {aside.step} under {uri} is set aside ({aside.reason}): "
            + (instead if i == len(skipped) - 1 else "skipped"))
    return skipped


def restore_latest(uri: str, local_root: Path, log: Log = _print, earlier: list[Path] | None = None,
                   moved: list[Restored] | None = None, refused: list[str] | None = None,
                   nodes: int = 1, seen: list[Any] | None = None) -> Checkpoint | None:
    """Bring the newest checkpoint that verifies to ``local_root/step-<N>``; fall back to older ones, saying so.
    A checkpoint that does not verify is marked in the store (``store.quarantine``); one set aside (set_aside.py) is
    never taken, and said. Files this node already holds of it
    (in ``local_root`` or the ``earlier`` folders: what an earlier run on this machine left) are verified against
    the manifest and used instead of downloads. With ``moved``, what was moved is appended there and the caller
    says it (the node's one line), else it is logged here. With ``refused``, why each checkpoint it could not use
    failed is appended there. With ``seen``, the store's survey (store.Survey) and the checkpoints set aside that
    it passed over (set_aside.Aside) are appended there. ``nodes``: the job's; with several, a Checkpointer's DCP
    shards are left to the ranks whose load reads them (manifest.shards_on_demand)."""
    found = checkpoint_store.survey(uri, log=log)
    candidates = found.complete
    check_lineage(uri, candidates)
    passed = _say_set_aside(uri, found, log)
    if seen is not None:
        seen += [found, passed]
    for checkpoint in reversed(candidates):
        snapshot = is_dir_layout(checkpoint.manifest)  # a stack's own layout: back under the names it wrote
        target = local_root if snapshot else local_root / step_dir(checkpoint.step)
        if not snapshot and _restored_already(target, checkpoint):
            return checkpoint  # already here (the bootstrap restored it before the job started)
        try:
            done = download(checkpoint, target, log=log, earlier=earlier,
                            shards_later=shards_on_demand(checkpoint.manifest, nodes))
        except CorruptCheckpoint as exc:
            log(f"checkpoint {checkpoint.uri} is corrupt ({exc}); falling back to the previous one")
            checkpoint_store.quarantine(checkpoint, str(exc), log=log)
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


def _overlaps(uri: str, local_root: Path) -> bool:
    if not uri.startswith("file://"):
        return False
    store, local = storage.local_path(uri).resolve(), local_root.resolve()
    return is_within(store, local) or is_within(local, store)


def restore_report(uri: str, local: Path, earlier: list[Path] | None = None, nodes: int = 1) -> dict[str, Any]:
    """The node's restore, before its workers start (the bootstrap, through cloudtrain.node.steps, or
    ``python -m cloudtrain.checkpoint restore``): ``{"step": N or None, "error": why or None}``. ``nodes``: the
    job's (restore_latest)."""
    if _overlaps(uri, local):
        _print(f"warning: the checkpoint URI {uri} and CLOUDTRAIN_CHECKPOINT_DIR {local} are the same folder (or "
               "one holds the other): the store then holds the script's own folders too; give the checkpoint "
               "URI a folder of its own")
    try:
        moved: list[Restored] = []
        refused: list[str] = []
        seen: list[Any] = []
        found = restore_latest(uri, local, earlier=earlier, moved=moved, refused=refused, nodes=nodes, seen=seen)
    except CloudtrainError as exc:  # unreadable store, or another job's checkpoints: the node stops, saying why
        return {"step": None, "error": f"{exc.message}; {exc.remedy}" if exc.remedy else exc.message}
    entries = found.manifest.get("entries") if found and is_dir_layout(found.manifest) else None
    survey: checkpoint_store.Survey = seen[0]
    # ``checkpoint``, ``passed`` (set aside, newer than it) and ``known`` (the digest of every checkpoint the store
    # held: what this run publishes is new) are for the node's judgement should its workers fail
    # (cloudtrain/node/unloadable.py)
    return {"step": found.step if found else None, "error": None, "entries": entries,
            "moved": moved[0].summary() if moved else None, "refused": refused, "checkpoint": found,
            "passed": seen[1], "known": {c.digest for c in [*survey.complete, *survey.set_aside]}}


def resume_point(uri: str | None) -> str:
    """What a restart of a job with this checkpoint URI starts from, in words: ``from checkpoint N (...) under URI``
    or ``from scratch: ...`` (what `preempt`, `wait` and `status` say, so a restart never claims a resume)."""
    if not uri:
        return "from scratch: the job has no checkpoint.uri"
    complete = checkpoint_store.list_complete(uri, log=lambda _message: None)
    if not complete:
        return f"from scratch: no checkpoint is published under {uri} yet"
    newest = complete[-1]
    entries = newest.manifest.get("entries") if is_dir_layout(newest.manifest) else None
    what = f" ({', '.join(map(str, entries))})" if isinstance(entries, list) and entries else ""
    return f"from checkpoint {newest.step}{what} under {uri}"
