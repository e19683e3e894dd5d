"""Copy a job's newest verified checkpoint from one store to another (s3 -> gs -> az ...), for a job that moves to
the next provider of its fallback list.

Each file is streamed from the source through a hash into a spooled temporary file (never the whole checkpoint on
disk, never a file in memory), checked against the manifest's sha256 and size, then put to the target; the
manifest is written last, byte for byte as the source holds it, so the copy exists only once it is whole. Resumable:
a file already at the target with the manifest's size and sha256 is skipped (a copy cut short is taken up where it
stopped). A source file that does not match its manifest condemns that checkpoint and the next older one is tried.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain import storage
from cloudtrain.checkpoint.manifest import MANIFEST, CorruptCheckpoint, checked_files, step_dir
from cloudtrain.checkpoint.store import Checkpoint, list_complete
from cloudtrain.errors import CloudtrainError

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]


@dataclass
class Copied:
    step: int
    source: str  # the step folder copied
    target: str  # the store it now is under (the new leg's checkpoint.uri)
    files: int
    copied_bytes: int
    skipped: int  # files already at the target with the right hash


def _digest(uri: str) -> tuple[str, int] | None:
    """sha256 and size of an object, streamed; None when it does not exist."""
    store = storage.store_for(uri)
    if not store.exists(uri):
        return None
    sha, size = hashlib.sha256(), 0
    _, chunks = store.read_stream(uri)
    for chunk in chunks:
        sha.update(chunk)
        size += len(chunk)
    return sha.hexdigest(), size


def _copy_file(source: str, target: str, entry: dict[str, object], spool: Path) -> int:
    store = storage.store_for(source)
    sha, size = hashlib.sha256(), 0
    local = spool / "part"
    with open(local, "wb") as out:
        _, chunks = store.read_stream(source)
        for chunk in chunks:
            sha.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if sha.hexdigest() != entry["sha256"] or size != entry["size"]:
        raise CorruptCheckpoint(f"{source} does not match its manifest (size or sha256)")
    storage.with_retries(lambda: storage.put_file(local, target), f"writing {target}")
    local.unlink()
    return size


def copy_checkpoint(checkpoint: Checkpoint, target_uri: str, log: Log = print) -> Copied:
    """One verified checkpoint to ``target_uri/step-<N>/`` (see the module's docstring)."""
    files = checked_files(checkpoint.manifest, checkpoint.step)
    folder = storage.join(target_uri, step_dir(checkpoint.step))
    total = sum(int(f["size"]) for f in files)
    done = copied = skipped = 0
    manifest = storage.read_bytes(storage.join(checkpoint.uri, MANIFEST))
    with tempfile.TemporaryDirectory(prefix="cloudtrain-copy-") as spool:
        for n, entry in enumerate(files, 1):
            source, target = storage.join(checkpoint.uri, entry["path"]), storage.join(folder, entry["path"])
            if _digest(target) == (entry["sha256"], entry["size"]):
                skipped += 1
            else:
                copied += _copy_file(source, target, entry, Path(spool))
            done += int(entry["size"])
            log(f"copying {checkpoint.uri} -> {folder}: {n}/{len(files)} files, {done}/{total} bytes"
                + (f" ({skipped} already there)" if skipped else ""))
    storage.write_bytes(storage.join(folder, MANIFEST), manifest)  # last: from now on the copy exists
    return Copied(checkpoint.step, checkpoint.uri, target_uri, len(files), copied, skipped)


def carry_newest(source_uri: str, target_uri: str, log: Log = print) -> Copied | None:
    """The newest checkpoint under ``source_uri`` that verifies, copied to ``target_uri``; older ones are tried
    when a newer one does not match its manifest. None: there is no checkpoint to carry (the job starts over)."""
    for checkpoint in reversed(list_complete(source_uri, log=log)):
        try:
            return copy_checkpoint(checkpoint, target_uri, log)
        except CorruptCheckpoint as exc:
            log(f"checkpoint {checkpoint.uri} is corrupt ({exc}); carrying the previous one")
        except OSError as exc:
            raise CloudtrainError(f"copying {checkpoint.uri} to {target_uri} failed: {exc}",
                                  remedy="run the same command again: files already copied are skipped") from None
    return None
