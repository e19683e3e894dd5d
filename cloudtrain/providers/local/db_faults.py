"""What a failed SQLite call on the job database means for the user: one HomeError naming the file and the fix (a
lock held past the stated wait, a full disk, a read-only home), or, for a file that is not a database any more, a
copy set aside so a new one can start."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import sys
import time
from pathlib import Path

from cloudtrain.errors import HomeError
from cloudtrain.home.errors import home_problem

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

# SQLite's primary result codes by name (sqlite_errorname, Python 3.11+), else by the words of its message
_KINDS = {"SQLITE_CORRUPT": "corrupt", "SQLITE_NOTADB": "corrupt", "SQLITE_BUSY": "locked", "SQLITE_LOCKED": "locked",
          "SQLITE_FULL": "full", "SQLITE_READONLY": "read-only", "SQLITE_CANTOPEN": "cannot open",
          "SQLITE_IOERR": "io"}
_WORDS = {"malformed": "corrupt", "not a database": "corrupt", "locked": "locked", "is full": "full",
          "readonly": "read-only", "unable to open": "cannot open", "disk i/o": "io"}


class DatabaseLocked(HomeError):
    """Another process held the job database's lock for longer than the stated wait."""


def kind(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", "") or ""
    for prefix, found in _KINDS.items():
        if name == prefix or name.startswith(prefix + "_"):
            return found
    text = str(exc).lower()
    return next((found for words, found in _WORDS.items() if words in text), "other")


def db_problem(exc: sqlite3.Error, path: Path, busy_seconds: float) -> HomeError:
    if kind(exc) == "locked":
        return DatabaseLocked(f"the job database {path} is locked by another process: waited {busy_seconds:g} s "
                              "for it", remedy=f"try again when that process is done; `fuser {path}` names it (a "
                                               "sqlite3 shell, a backup tool, a stuck cloudtrain)")
    return home_problem(path, "use the job database", code=errno.ENOSPC if kind(exc) == "full" else None,
                        reason=str(exc))


def _still_corrupt(path: Path) -> bool:
    try:
        conn = sqlite3.connect(path, timeout=1)
        try:
            return bool(conn.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok")
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return kind(exc) == "corrupt"


def set_aside(path: Path, why: str) -> Path | None:
    """Rename a job database that is not one any more (garbage, torn pages) with its -wal/-shm to
    ``<name>.corrupt-<UTC time>`` and say so on stderr: the next open starts a new one. Done under a lock on the
    file and only while it is still the corrupt one, so of several processes that found it so, one sets it aside
    and the rest use the new database. Returns the copy's path, or None when there was nothing to set aside."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino != path.stat().st_ino or not _still_corrupt(path):
                return None  # another process set it aside already
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        while aside.exists():
            aside = aside.with_name(aside.name + "-1")
        for suffix in ("-wal", "-shm"):  # first: an old write-ahead log must never be read into the new database
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{path}{suffix}", f"{aside}{suffix}")
        os.rename(path, aside)
    except OSError as exc:
        raise home_problem(path, "set aside the corrupt job database", code=exc.errno,
                           reason=exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        print(f"note: the job database {path} could not be read ({why}): it was set aside as {aside} and a new one "
              f"started. Jobs recorded only in the old one are no longer listed; their folders under "
              f"{path.parent / 'jobs'} remain, and `sqlite3 {aside} .recover` may salvage its records.",
              file=sys.stderr, flush=True)
    return aside
