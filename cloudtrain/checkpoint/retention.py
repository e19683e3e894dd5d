"""Retention: which checkpoints a store keeps, and which step folders a node's disk keeps (stdlib only).

The store keeps the newest K (K >= 2 by spec) complete checkpoints and never deletes the newest one that verifies; a
node's disk keeps the newest folder only. Local deletes are never mirrored to the bucket.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import safe_json, storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.download import log_line
from cloudtrain.checkpoint.manifest import MANIFEST, QUARANTINE_PREFIX, quarantine_name, safe_relative, step_dir

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]


def apply_retention(uri: str, keep: int, log: Log = log_line, *, lineage: str | None = None) -> list[int]:
    """Delete all but the newest ``keep`` (>= 1 enforced; >= 2 by spec) complete checkpoints, and other step
    folders (partial, unusable, found corrupt) older than the newest complete one; never one set aside
    (set_aside.py). A manifest is deleted before its files, so a half-deleted checkpoint is never mistaken for a
    complete one. Only checkpoints that verify as far
    as cloudtrain has seen count: one found corrupt is never among the ``keep``, and what is newer than the newest
    complete checkpoint is left alone (it may be in flight, or be published again).

    Only this job's lineage's steps (``lineage``, default CLOUDTRAIN_LINEAGE) are counted and deleted: a folder
    whose manifest names another lineage is never deleted, complete or not (a job that took the URI over, or ran
    beside another before one job held a URI at a time, leaves the other's checkpoints as they are). A manifest
    without a lineage (written before lineages existed) counts as this job's, as before, and so does a folder
    without a manifest: it belongs to nobody, and under the URI's writer lease (writer.py) one older than this
    job's newest checkpoint is a killed upload's leftovers, whoever started it. Returns the steps removed."""
    keep = max(keep, 1)
    mine = os.environ.get(checkpoint_store.LINEAGE_ENV) if lineage is None else lineage
    present = checkpoint_store.objects_by_step(uri, temp=True)
    survey = checkpoint_store.survey_among(uri, present, log=lambda _m: None)
    theirs = {c.step for c in [*survey.complete, *survey.set_aside] if _another(c.manifest, mine)}
    complete = [c for c in survey.complete if c.step not in theirs]
    aside = {c.step for c in survey.set_aside}  # set aside: never deleted
    if not complete:
        return []
    kept = complete[-keep:]
    keep_steps = {c.step for c in kept}
    newest = complete[-1].step
    known = {c.step for c in [*survey.complete, *survey.set_aside]}
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
        if step >= newest or step in aside or step in theirs:
            continue
        if MANIFEST in ours and step not in known and _another(_manifest(folder), mine):
            continue  # another lineage's checkpoint that does not verify: still not this job's to delete
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


def _another(manifest: Any, mine: str | None) -> bool:
    """A manifest of another lineage than ``mine`` (None: this caller has none, and every checkpoint is its own)."""
    theirs = manifest.get("lineage") if isinstance(manifest, dict) else None
    return bool(mine) and isinstance(theirs, str) and bool(theirs) and theirs != mine


def _manifest(folder: str) -> Any:
    """The manifest of a folder that did not verify, for its lineage; None where it is not JSON."""
    store = storage.store_for(folder)
    data = storage.with_retries(functools.partial(store.read_bytes, storage.join(folder, MANIFEST)),
                                f"reading {folder}/{MANIFEST}")
    try:
        return safe_json.loads(data, f"{folder}/{MANIFEST}")
    except safe_json.UnreadableJson:
        return None


def retain(uri: str, keep: int, after: str, log: Log = log_line, warn: Log = log_line) -> None:
    """``apply_retention`` with retries, after a checkpoint was published (``after`` names it): the checkpoint
    stands whatever happens here, so a failure is only said; what retention misses now, the next publish's removes."""
    try:
        storage.with_retries(lambda: apply_retention(uri, keep, log=log), f"retention under {uri}", log=warn)
    except Exception as exc:
        warn(f"retention after {after} failed: {exc}")


def prune_local(local_dir: Path, newest: int) -> None:
    """A node's disk keeps the newest step folder only (the bucket keeps ``keep``): older ``step-<N>`` folders go,
    a ``.partial`` one is left alone. Never mirrored to the bucket."""
    for folder in local_dir.glob("step-*"):
        if folder.name != step_dir(newest) and not folder.name.endswith(".partial"):
            try:
                if int(folder.name.split("-")[1]) < newest:
                    shutil.rmtree(folder, ignore_errors=True)
            except ValueError:
                continue
