"""What a checkpoint folder and its manifest must look like before cloudtrain trusts them (stdlib only).

Everything here reads data that came from a store, which anyone with write access (or a misconfigured job) can
fill with junk: a folder that is not named as cloudtrain names them, a manifest that is not a manifest, a file path
that climbs out of its folder. Such things are skipped or called corrupt, never followed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MANIFEST = "manifest.json"
# A manifest whose file paths are relative to the script's checkpoint folder itself (a snapshot of a stack's own
# layout: cloudtrain/checkpoint/snapshots.py), not to a step-<N> folder inside it; restored under those very names.
LAYOUT_DIR = "dir"
QUARANTINE_PREFIX = "quarantine-"  # step-N/quarantine-<manifest sha256>.json: a restore found that manifest corrupt
# step-N/set-aside-<manifest sha256>.json: that checkpoint verifies, but a start that restored it failed before any
# progress (or --restore-from passed over it): no restore takes it, no retention deletes it (set_aside.py)
SET_ASIDE_PREFIX = "set-aside-"
# A DCP shard: one rank's part of the model and optimizer state (__<rank>_<i>.distcp), the bulk of a checkpoint
SHARD_SUFFIX = ".distcp"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found in a store: its step, its folder's URI and its manifest."""

    step: int
    uri: str  # the step folder
    manifest: dict[str, Any]
    digest: str = ""  # sha256 of the manifest as stored: what a quarantine marker names


class CorruptCheckpoint(ValueError):
    """A checkpoint whose manifest is unusable or whose files do not match it: never loaded."""


def step_dir(step: int) -> str:
    return f"step-{step:09d}"


def step_of(name: str, canonical: bool = True) -> int | None:
    """The step a folder name stands for. In a store only the canonical name counts (``step-5`` is not step 5's
    folder); a script's own folder may use any number of digits (``canonical=False``)."""
    match = _STEP_DIR.match(name)
    if not match:
        return None
    step = int(match.group(1))
    return step if not canonical or name == step_dir(step) else None


def is_dir_layout(manifest: Any) -> bool:
    return isinstance(manifest, dict) and manifest.get("layout") == LAYOUT_DIR


def shards_on_demand(manifest: Any, nodes: int) -> bool:
    """Whether a node's restore leaves this checkpoint's DCP shards to the ranks whose load reads them
    (cloudtrain/checkpoint/on_demand.py): a Checkpointer's checkpoint ("full") on a job of several nodes, where each
    node's ranks read only part of the shards (their own, at an unchanged sharding)."""
    return nodes > 1 and isinstance(manifest, dict) and manifest.get("kind") == "full"


def is_shard(path: str) -> bool:
    return path.endswith(SHARD_SUFFIX)


def quarantine_name(manifest_digest: str) -> str:
    return f"{QUARANTINE_PREFIX}{manifest_digest}.json"


def set_aside_name(manifest_digest: str) -> str:
    return f"{SET_ASIDE_PREFIX}{manifest_digest}.json"


def safe_relative(path: str) -> bool:
    """A path that stays inside the folder it is joined to, on a file system and in every object store."""
    parts = path.split("/")
    return bool(path) and "\x00" not in path and not any(p in ("", ".", "..") for p in parts)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checked_files(manifest: Any, step: int) -> list[dict[str, Any]]:
    """The manifest's file list, once every entry is a safe relative path with a size and a sha256; raises
    CorruptCheckpoint naming the first thing wrong."""
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"the manifest is a {type(manifest).__name__}, not an object")
    if manifest.get("step") != step or not _is_count(manifest.get("step")):
        raise CorruptCheckpoint(f"the manifest says step {manifest.get('step')!r}, its folder step {step}")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise CorruptCheckpoint("the manifest has no list of files")
    seen: set[str] = set()
    for entry in files:
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"a file entry is a {type(entry).__name__}, not an object")
        path = entry.get("path")
        if not isinstance(path, str) or not safe_relative(path) or path == MANIFEST:
            raise CorruptCheckpoint(f"file path {path!r} is not a relative path inside the checkpoint folder")
        if path in seen:
            raise CorruptCheckpoint(f"file {path!r} is listed twice")
        seen.add(path)
        if not _is_count(entry.get("size")):
            raise CorruptCheckpoint(f"file {path!r} has no valid size")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            raise CorruptCheckpoint(f"file {path!r} has no valid sha256")
    return files
