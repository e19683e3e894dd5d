"""Where `cloudtrain report -o` (and ``Run.report``) writes the page: a file replaced whole, a folder's
``report-<job>.html``, a FIFO or a device written into as it is and never replaced."""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from cloudtrain.errors import UserError
from cloudtrain.regular_files import special, special_kind


def write(data: bytes, output: str | None, job_id: str) -> tuple[Path, bool]:
    """Write the page where ``-o`` says; returns where it went and whether that is a regular file.

    No ``-o``: ./report-JOB.html. A folder: report-JOB.html in it. A regular file (or a link to one): replaced whole
    or not at all (a temporary file beside it, renamed over it; a link keeps pointing at it). A FIFO or a character
    device (/dev/null, /dev/stdout, a terminal) is written into as it is, never replaced: a FIFO waits for its
    reader. A socket or a block device is refused. What cannot be written (a full disk, /dev/full, no permission)
    is a UserError naming ``-o``'s path, not the temporary file's."""
    from cloudtrain.storage.local import atomic_write

    name = f"report-{job_id}.html"
    target = Path(output or name)
    if target.is_dir():
        target = target / name
        if target.is_dir():
            raise UserError(f"{target} is a folder: the report cannot be written over it",
                            remedy=f"remove that folder, or give -o another file name than {name}")
    above = next((p for p in target.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():  # mkdir would say "File exists"
        raise UserError(f"cannot write the report to {target}: {above} is not a folder",
                        remedy="give -o a file or a folder (the page is report-JOB.html in it)")
    kind = special(target)  # a link judged by what it points at
    if kind is not None and not kind.startswith(("a FIFO", "a character device")):
        raise UserError(f"{target} is {kind}: no file to write a page into, and cloudtrain does not replace it",
                        remedy="give -o a file or a folder (the page is report-JOB.html in it)")
    try:
        own = _own_descriptor(target)
        if own is not None:  # /dev/stdout, /dev/fd/N: where the shell pointed it, appending if it appends
            _write_all(own, data)
            return target, False
        if kind is not None and _write_in_place(target, data):
            return target, False
        real = Path(os.path.realpath(target)) if target.is_symlink() else target
        atomic_write(real, lambda out: out.write(data))  # whole or not at all
        return target, True
    except BrokenPipeError:  # the reader went away (`-o /dev/stdout | head`): as for any command's output
        raise
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise UserError(f"cannot write the report to {target}: {exc.strerror or exc}" + (
                            " (nothing was written)" if kind is None and own is None else ""),
                        remedy="free some space or give -o a path on another disk" if full else
                        "check the path and its permissions, or give -o another file or folder") from None


def _own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names through a link or a chain of them (/dev/stdout,
    /dev/fd/1, /proc/self/fd/1), if it names one."""
    own = f"/proc/{os.getpid()}/fd"
    hop = str(path.absolute())
    for _ in range(40):
        if os.path.basename(hop).isdigit() and os.path.realpath(os.path.dirname(hop)) == own:
            return int(os.path.basename(hop))
        if not os.path.islink(hop):
            return None
        hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_in_place(path: Path, data: bytes) -> bool:
    """Write into the FIFO or the device ``path`` is; False, with nothing written, when it turned out to be a
    regular file (swapped since it was judged): that is replaced whole instead."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)  # a FIFO with no reader: ENXIO at once, instead of waiting
    except OSError as exc:
        if exc.errno != errno.ENXIO or special_kind(os.stat(path).st_mode) != "a FIFO (named pipe)":
            raise
        print(f"waiting for a reader of the FIFO {path} ...", file=sys.stderr, flush=True)
        fd = os.open(path, flags)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.set_blocking(fd, True)
        _write_all(fd, data)
        return True
    finally:
        os.close(fd)
