"""Downloading one checkpoint into a node's folder: every file fetched at once and hashed as it arrives, checked
against the manifest, staged beside the target and moved into place whole (stdlib only). A file the node already
holds (its own earlier save or restore of that step) is verified and used instead of downloaded; a file:// store's
files are read straight from disk. Which checkpoint to restore is cloudtrain/checkpoint/store.py's decision.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import storage
from cloudtrain.checkpoint.manifest import (
    MANIFEST,
    Checkpoint,
    CorruptCheckpoint,
    checked_files,
    is_dir_layout,
    is_shard,
    step_dir,
)
from cloudtrain.storage import transfer
from cloudtrain.storage.paths import is_within

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]


def log_line(message: str) -> None:
    """The default log of everything that publishes or restores checkpoints."""
    print(f"[cloudtrain] {message}", file=sys.stderr, flush=True)


_print = log_line


def _staging_folder(target: Path) -> Path:
    """Where ``target`` (``<root>/step-N``) is downloaded before it verifies: beside ``<root>``, never in it, so a
    script reading ``<root>`` sees only verified checkpoints. Inside ``<root>`` under a hidden name only where
    its parent is unwritable or another filesystem (the final move must be a rename)."""
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    beside = root.parent / f".{root.name}.incoming"
    try:
        beside.mkdir(exist_ok=True)
        if beside.stat().st_dev == root.stat().st_dev:
            return beside / target.name
        beside.rmdir()
    except OSError:
        pass
    return root / ".cloudtrain-incoming" / target.name


def matches(entry: dict[str, Any], got: transfer.Fetched) -> bool:
    return got.stored_size == entry["size"] and got.size == entry["size"] and got.sha256 == entry["sha256"]


@dataclass
class Restored:
    """What a restore moved: bytes in all, and how many of them came from a copy already on this node."""

    bytes: int = 0
    local_bytes: int = 0
    seconds: float = 0.0
    left_bytes: int = 0  # shards left to the ranks that read them (on_demand.py)

    def summary(self) -> str:
        rate = self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        local = f"; {self.local_bytes / 1e9:.2f} GB verified from this node's own copy" if self.local_bytes else ""
        left = f"; {self.left_bytes / 1e9:.2f} GB of shards left to the ranks that read them" \
            if self.left_bytes else ""
        return f"{self.bytes / 1e9:.2f} GB in {self.seconds:.1f}s, {rate:.2f} GB/s{local}{left}"


def _reuse_local(files: list[dict[str, Any]], folders: list[Path], staged: Path) -> set[int]:
    """Files of this checkpoint a node already holds (its own earlier save or restore of the same step, in the
    checkpoint folder or set aside from an earlier run): each one whose size and sha256 match the manifest is
    linked (or copied) into ``staged`` instead of downloaded. Returns the indexes of the files so reused."""
    candidates: dict[int, Path] = {}
    for i, entry in enumerate(files):
        for folder in folders:
            local = folder / entry["path"]
            with contextlib.suppress(OSError):
                if local.is_file() and not local.is_symlink() and local.stat().st_size == entry["size"]:
                    candidates[i] = local
                    break
    if not candidates:
        return set()
    order = sorted(candidates)
    digests = transfer.hash_many([candidates[i] for i in order])
    reused = set()
    for i, digest in zip(order, digests):
        if digest != files[i]["sha256"]:
            continue
        local = staged / files[i]["path"]
        try:
            os.link(candidates[i], local)
        except OSError:
            shutil.copyfile(candidates[i], local)
        reused.add(i)
    return reused


def fetch_objects(store: Any, items: list[tuple[str, Path, int]], link: bool, log: Log) -> list[transfer.Fetched]:
    """The store's objects into local paths, hashed as they arrive: a file:// store's files are read straight from
    disk (linked where ``link`` allows), any other store's are streamed (transfer.download_many)."""
    path_of = getattr(store, "path_of", None)
    if path_of is None:
        return transfer.download_many(store, items, log=log)
    return transfer.copy_many([(path_of(uri), local, size) for uri, local, size in items], link=link)


def fetch_verified(store: Any, items: list[tuple[str, Path, int]], entries: list[dict[str, Any]], link: bool,
                   log: Log) -> None:
    """``fetch_objects``, each file checked against its manifest entry (size and sha256). A mismatch is confirmed by
    a second fetch: a reply cut short that the client did not notice must not condemn (and quarantine) a good
    checkpoint. Raises CorruptCheckpoint naming the first file still wrong."""
    fetched = fetch_objects(store, items, link, log)
    wrong = [i for i, got in enumerate(fetched) if not matches(entries[i], got)]
    if not wrong:
        return
    for i in wrong:
        items[i][1].unlink(missing_ok=True)
    again = fetch_objects(store, [items[i] for i in wrong], False, log)
    still = [entries[i]["path"] for i, got in zip(wrong, again) if not matches(entries[i], got)]
    if still:
        raise CorruptCheckpoint(f"{still[0]} does not match its manifest (size or sha256)")


def download(checkpoint: Checkpoint, target: Path, log: Log = _print, earlier: list[Path] | None = None,
             shards_later: bool = False) -> Restored:
    """Download and verify every file, then move the folder to ``target`` whole. Raises CorruptCheckpoint when the
    manifest is unusable or a file does not match it, CloudtrainError when the store cannot be read; either way
    nothing is left behind and nothing is written outside ``target``. All files are fetched at once and hashed as
    they arrive (cloudtrain.storage.transfer). A file the node already holds under ``target`` or an ``earlier``
    folder (``<folder>/step-N/<path>``) with the manifest's size and sha256 is used instead of a download (a
    restart on the same machine). ``shards_later``: DCP shards the node does not hold are not downloaded; the
    ranks whose load reads them fetch them (on_demand.py)."""
    started = time.monotonic()
    files = checked_files(checkpoint.manifest, checkpoint.step)
    store = storage.store_for(checkpoint.uri)
    snapshot = is_dir_layout(checkpoint.manifest)
    # a snapshot's target is the script's checkpoint folder itself: staged beside it, as a step folder is beside its
    staged = _staging_folder(target / ".snapshot" if snapshot else target)
    shutil.rmtree(staged, ignore_errors=True)  # a killed restore's leftovers
    try:
        staged.mkdir()
        inside = staged.resolve()
        items = []
        for entry in files:
            local = staged / entry["path"]
            if not is_within(local.resolve(), inside):  # paths were checked; this is the last word
                raise CorruptCheckpoint(f"{entry['path']!r} escapes the checkpoint folder")
            local.parent.mkdir(parents=True, exist_ok=True)
            items.append((storage.join(checkpoint.uri, entry["path"]), local, int(entry["size"])))
        folders = [] if snapshot else [target, *(e / step_dir(checkpoint.step) for e in earlier or [])]
        reused = _reuse_local(files, folders, staged)
        later = {i for i in range(len(files)) if shards_later and i not in reused and is_shard(files[i]["path"])}
        rest = [i for i in range(len(files)) if i not in reused and i not in later]
        # the Checkpointer's own files ("full") are never rewritten in place: a file:// store's may be linked
        link = checkpoint.manifest.get("kind") == "full"
        fetch_verified(store, [items[i] for i in rest], [files[i] for i in rest], link, log)
        if snapshot:  # the script's own names, in its folder, and nothing beside them
            place(staged, target)
        else:
            (staged / MANIFEST).write_text(json.dumps(checkpoint.manifest, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staged, target)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
        with contextlib.suppress(OSError):
            staged.parent.rmdir()  # only once empty: another restore may be using it
    return Restored(bytes=sum(int(f["size"]) for i, f in enumerate(files) if i not in later),
                    local_bytes=sum(int(files[i]["size"]) for i in reused), seconds=time.monotonic() - started,
                    left_bytes=sum(int(files[i]["size"]) for i in later))


def place(staged: Path, root: Path) -> None:
    """Move a verified snapshot's entries from ``staged`` into the checkpoint folder ``root``, each replacing what
    had its name there (a fresh node's folder is empty)."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.listdir(staged)):
        target = root / entry
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(staged / entry, target)
