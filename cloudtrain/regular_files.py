"""Reading the user's files without ever hanging on one that is not a regular file.

Opening a FIFO for reading waits for a writer, forever if none comes (``mkfifo data.yaml`` made ``cloudtrain plan``
hang); a device or a socket is no file to read either. So a file the user may have put anywhere is judged by
``stat`` before it is opened, opened with ``O_NONBLOCK`` (a FIFO opens at once instead of waiting), and judged
again by ``fstat`` on what was opened (it may have been swapped meanwhile). What is not a regular file raises
:class:`NotRegularFile`, an ``OSError``: callers that already handle an unreadable file handle it too.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class NotRegularFile(OSError):
    """``strerror`` says what the path is instead (``a FIFO (named pipe), not a regular file``)."""


def special_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file (None when it is one)."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def special(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is if it is a special file (a FIFO, a socket or a device; a link is judged by its target); None
    for a regular file, a folder or a path that cannot be stat'ed. Nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISDIR(mode) else special_kind(mode)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file; else NotRegularFile, without blocking."""
    kind = special(path)
    if kind is not None:  # judged before opening: opening a device can have effects of its own
        raise NotRegularFile(errno.EINVAL, f"{kind}, not a regular file", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:  # swapped for a FIFO between the stat and the open
            raise NotRegularFile(errno.EINVAL, f"{kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The content of a regular file (at most ``limit`` bytes when given)."""
    with open_regular(path) as f:
        return f.read() if limit is None else f.read(limit)


def read_text(path: str | os.PathLike[str], encoding: str = "utf-8", errors: str = "strict") -> str:
    return read_bytes(path).decode(encoding, errors)

