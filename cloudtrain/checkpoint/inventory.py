"""Every checkpoint a store holds, and whether a restore may take it: what `cloudtrain checkpoints HANDLE|URI` lists
(stdlib only, like the rest of the component; the CLI renders it).

One row per step folder, newest first: its step, the lineage (job) that wrote it, its files and their bytes, when it
was published, and its state: ``usable`` (the newest of them is what a restore takes), ``set aside`` (a start that
restored it failed before any progress, or ``--restore-from`` passed over it: set_aside.py), ``corrupt`` (a restore
found a file that does not match, or its manifest is unusable), ``incomplete`` (files its manifest lists are not
there), ``partial`` (no manifest: being written, or a save cut short); each but ``usable`` with why.
"""

from __future__ import annotations

from typing import Any

from cloudtrain import safe_json, storage
from cloudtrain.checkpoint import set_aside
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import MANIFEST, Checkpoint, is_dir_layout, quarantine_name, step_dir
from cloudtrain.errors import CloudtrainError


def _quiet(_line: str) -> None:
    pass


def _row(checkpoint: Checkpoint, state: str, why: str = "") -> dict[str, Any]:
    files = [f for f in checkpoint.manifest.get("files") or [] if isinstance(f, dict)]
    created = checkpoint.manifest.get("created")
    entries = checkpoint.manifest.get("entries") if is_dir_layout(checkpoint.manifest) else None
    return {"step": checkpoint.step, "state": state, "why": why, "uri": checkpoint.uri,
            "lineage": checkpoint.manifest.get("lineage"), "files": len(files),
            "bytes": sum(int(f.get("size") or 0) for f in files),
            "created": created if isinstance(created, (int, float)) and not isinstance(created, bool) else None,
            "entries": entries if isinstance(entries, list) else None}


def _quarantine_reason(refused: checkpoint_store.Refused) -> str:
    """Why a restore found it corrupt, as its quarantine marker says."""
    try:
        where = storage.join(refused.uri, quarantine_name(refused.digest))
        marker = safe_json.loads(storage.read_bytes(where), where)
        return f"{refused.why}: {marker['reason']}"
    except (CloudtrainError, OSError, ValueError, KeyError, TypeError):
        return refused.why


def inventory(uri: str) -> dict[str, Any]:
    """``{"uri", "resumes": the step a restore takes (None: from scratch), "checkpoints": rows, newest first}``."""
    present = checkpoint_store.objects_by_step(uri)
    found = checkpoint_store.survey_among(uri, present, _quiet)
    rows = [_row(c, "usable") for c in found.complete]
    for checkpoint in found.set_aside:
        aside = set_aside.read(checkpoint)
        row = _row(checkpoint, "set aside", aside.reason)
        rows.append({**row, "set_aside": {"kind": aside.kind, "at": aside.at, "by": aside.by}})
    for refused in found.refused:
        why = _quarantine_reason(refused) if refused.digest and refused.kind == "corrupt" else refused.why
        rows.append({"step": refused.step, "state": refused.kind, "why": why, "uri": refused.uri, "lineage": None,
                     "files": None, "bytes": None, "created": None, "entries": None})
    listed = {row["step"] for row in rows}
    for step, names in present.items():
        if step not in listed and MANIFEST not in names:
            rows.append({"step": step, "state": "partial", "why": "no manifest: being written, or a save cut short",
                         "uri": storage.join(uri, step_dir(step)), "lineage": None, "files": len(names),
                         "bytes": None, "created": None, "entries": None})
    rows.sort(key=lambda row: row["step"], reverse=True)
    return {"uri": uri, "resumes": found.complete[-1].step if found.complete else None, "checkpoints": rows}
