"""The files a node writes for itself (its status file, the masked copy of its workers' logs) on a disk that filled
up, most often with the job's own checkpoints: one line naming the folder and the fix, the node ending failed with
that reason, never a traceback.

The status file is how a local job's supervisor learns how each node ended (it exists once the node ended). So
that a full disk cannot take that away, the bootstrap holds its room from the node's start (``reserve``: a file of
blanks beside it, ``<status>.room``); when the end's whole-file write (a temp file renamed over the status) is refused
for want of space, the status is written into that room in place, as failed with why, and the room renamed to the
status (neither takes new blocks). Standard library only, Python 3.8 (the node entry, cloudtrain/node/entry.py, runs it
from the bundle's lib/).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left; a disk quota reached
RESERVE_BYTES = 64 * 1024  # the status file's room, held from the node's start: far more than a status takes
_KEPT = ("outcome", "returncode", "started", "ended", "reason", "error", "cluster")  # what a status cut to fit keeps


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def full_line(folder: object, doing: str) -> str:
    """What a node says when a write is refused for want of space: what it could not do, where, and the fix."""
    return (f"cannot {doing}: no space left on the disk holding {folder}: free space there, move the job's working "
            "folder to a disk with room (a local job: CLOUDTRAIN_HOME), or keep fewer checkpoints "
            "(checkpoint.keep)")


def refused(exc: OSError, workdir: str) -> str:
    """The line for a write a full disk refused while the node starts or ends (``disk_full`` holds)."""
    where = Path(exc.filename).parent if exc.filename else Path(workdir)
    return full_line(where, f"write {Path(exc.filename).name}" if exc.filename else "write the node's files")


def _room(target: Path) -> Path:
    return target.with_name(target.name + ".room")


def reserve(path: str | None) -> None:
    """At the node's start: the room for its status file, blanks holding RESERVE_BYTES of the disk (best effort: a
    disk already full gives none)."""
    if not path:
        return
    target = _room(Path(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            out.write(b" " * RESERVE_BYTES)  # written, not sparse: the blocks are held
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            target.unlink()  # a blank cut short is still blank; none at all is clearer
        return


def write_status(path: str | None, status: dict[str, object]) -> str | None:
    """Write the node's status file whole. Where that is refused (a full disk; a folder gone read-only), the status
    goes, as failed with why, into the room ``reserve`` held; returns that why (None: written as asked)."""
    if not path:
        return None
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(status, indent=2))
        os.replace(tmp, target)
        with contextlib.suppress(OSError):
            _room(target).unlink()  # not needed any more
        return None
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        why = full_line(target.parent, "write the node's status file") if disk_full(exc) else \
            f"cannot write the node's status file {target}: {exc.strerror or exc}"
    failed = dict(status, outcome="failed", reason=why)
    if status.get("outcome") == "failed" and status.get("reason") and not status.get("error"):
        failed["error"] = status["reason"]  # why it failed before the disk filled stays said
    with contextlib.suppress(OSError):
        if _in_place(_room(target), failed):
            os.replace(_room(target), target)
    return why


def _in_place(room: Path, status: dict[str, object]) -> bool:
    """``status`` written over the reserved blanks (no new blocks needed; JSON allows the blanks after it)."""
    try:
        with open(room, "r+b") as out:
            size = os.fstat(out.fileno()).st_size
            data = json.dumps(status).encode()
            if len(data) > size:  # the essentials only
                data = json.dumps({k: status[k] for k in _KEPT if k in status}).encode()
            if len(data) > size:
                return False
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return True
    except OSError:
        return False
