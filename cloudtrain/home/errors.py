"""A folder cloudtrain writes its own files in (``CLOUDTRAIN_HOME``, the local store) that refused a write, said once
with the fix: a full disk, a read-only file system, a folder this user may not write, or what the system said."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from cloudtrain.errors import HomeError

FULL_BYTES = 1024 * 1024  # less free space than this: the disk counts as full (what SQLite's "disk I/O error" meant)
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM)
HOME_FIX = ("set CLOUDTRAIN_HOME to a writable folder on a disk with room (cloudtrain keeps its job database, "
            "bundles and job logs there)")


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent: where the disk and its mount can be asked about."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Free bytes on the disk holding ``path``; -1 when that cannot be told."""
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return -1


def read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(_existing(path)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"


def home_problem(path: Path, doing: str, *, code: int | None = None, reason: str = "",
                 elsewhere: str | None = None) -> HomeError:
    """The error for a write under ``path`` that failed: "cannot <doing>: <why>". ``code``: the errno, when the
    system gave one (SQLite does not): without it the disk and its mount are looked at."""
    path = Path(path)
    fix = elsewhere or HOME_FIX
    if code == errno.EROFS or (code not in _FULL and read_only(path)):
        return HomeError(f"cannot {doing}: {path} is on a read-only file system",
                         remedy=f"remount it read-write, or {fix}")
    if code in _FULL or (code is None and 0 <= free_bytes(path) < FULL_BYTES):
        return HomeError(f"cannot {doing}: no space left on the disk holding {path} "
                         f"({_size(max(free_bytes(path), 0))} free now)", remedy=f"free space on that disk, or {fix}")
    found = _existing(path)
    must_write = [found] if found.is_dir() else [found, found.parent]  # a file, and its folder (SQLite's -wal)
    if code in _DENIED or not all(os.access(p, os.W_OK) for p in must_write):
        return HomeError(f"cannot {doing}: {path} is not writable by this user",
                         remedy=f"give this user write access to it (chown / chmod), or {fix}")
    return HomeError(f"cannot {doing}: {path}: {reason or 'failed'}",
                     remedy=f"check that disk (dmesg) and the folder's permissions, or {fix}")


def os_problem(exc: OSError, path: Path, doing: str, elsewhere: str | None = None) -> HomeError:
    return home_problem(path, doing, code=exc.errno, reason=exc.strerror or str(exc), elsewhere=elsewhere)


def is_write_error(exc: BaseException, folder: Path) -> bool:
    """An OSError from writing into ``folder`` (a disk full or read-only: errors only a write meets), not from
    reading what is packaged."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in (*_FULL, errno.EROFS):
        return True
    return bool(exc.filename) and Path(str(exc.filename)).resolve().is_relative_to(folder.resolve())
