"""file:// objects: atomic writes (temp file + rename), no folders left empty behind deletes."""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from cloudtrain.errors import UserError
from cloudtrain.storage.transfer import chunked

# copy_file_range/sendfile refused for these files (old kernel, another file system, a special file): copy in Python
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def local_path(uri: str) -> Path:
    """The local path behind a ``file://`` URI (or a plain path)."""
    if "://" not in uri:
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise UserError(f"{uri!r} is not a file:// URI")
    if parsed.netloc not in ("", "localhost"):
        raise UserError(f"{uri!r} names a host; file URIs must be file:///absolute/path",
                        remedy="write three slashes: file:///path/to/dir")
    return Path(unquote(parsed.path))


def atomic_write(target: Path, writer: Callable[[BinaryIO], object]) -> None:
    """Write ``target`` whole or not at all: a temporary file of this writer's own beside it, renamed over it (two
    writers at once each rename their own; a reader sees one whole version or the other)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    if fcntl is not None:  # held while we write: a .part nobody holds was left by a writer that died
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with os.fdopen(fd, "wb") as out:
            writer(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def kernel_copy(src: BinaryIO, out: BinaryIO) -> None:
    """Copy ``src`` to ``out`` inside the kernel (copy_file_range: a reflink where the file system shares extents;
    else sendfile), falling back to read/write where neither applies."""
    out.flush()
    size, done = os.fstat(src.fileno()).st_size, 0
    for call in (getattr(os, "copy_file_range", None), getattr(os, "sendfile", None)):
        if call is None:
            continue
        try:
            while done < size:
                if call is os.sendfile:  # (out, in, offset, count): the output's own position moves
                    moved = os.sendfile(out.fileno(), src.fileno(), done, min(size - done, 1 << 30))
                else:  # (in, out, count, in offset, out offset)
                    moved = call(src.fileno(), out.fileno(), min(size - done, 1 << 30), done, done)  # type: ignore[call-arg]
                if moved == 0:
                    break
                done += moved
            return
        except OSError as exc:
            if done or exc.errno not in _NO_KERNEL_COPY:
                raise
    src.seek(done)
    out.seek(done)
    shutil.copyfileobj(src, out, 8 * 1024 * 1024)


def sweep_abandoned_parts(root: Path, min_age: float = 2.0) -> int:
    """Remove the ``.part`` files under ``root`` that no writer holds (their writer was killed: a CLI SIGKILLed while
    staging). ``min_age`` seconds spare one that was created a moment ago and is about to be locked. Returns how
    many were removed; without ``fcntl`` (Windows) none is."""
    removed = 0
    for part in root.rglob(".*.part") if fcntl is not None and root.is_dir() else []:
        try:
            if time.time() - part.stat().st_mtime < min_age:
                continue
            with open(part, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its writer lives
                part.unlink()
                removed += 1
        except OSError:  # held (BlockingIOError), or gone meanwhile
            continue
    return removed


class LocalStore:
    def path_of(self, uri: str) -> Path:
        """The file behind an object: a restore reads it straight from disk (storage.transfer.copy_many)."""
        return local_path(uri)

    def exists(self, uri: str) -> bool:
        return local_path(uri).exists()

    def read_bytes(self, uri: str) -> bytes:
        """The object's bytes. A FIFO (or a device) in an object's place is an OSError, never waited on for ever: a
        writer that never comes would hang whoever reads a lease or a manifest there."""
        path = local_path(uri)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            if not stat.S_ISREG(mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            with open(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)

    def write_bytes(self, uri: str, data: bytes) -> None:
        atomic_write(local_path(uri), lambda out: out.write(data))

    def put_file(self, source: Path, uri: str, progress: Callable[[int], None] | None = None) -> int:
        def copy(out: BinaryIO) -> None:
            with open(source, "rb") as src:
                if progress is None:
                    kernel_copy(src, out)
                    return
                while chunk := src.read(1024 * 1024):
                    out.write(chunk)
                    progress(len(chunk))

        atomic_write(local_path(uri), copy)
        return source.stat().st_size

    def link_file(self, source: Path, uri: str) -> int:
        """``put_file`` for a file that is never rewritten in place (a new file replaces it, as the Checkpointer's
        are): a hard link where the store is on the same file system, so publishing costs no copy; else a copy.
        The file is fsync'd either way: the store is the copy that must survive the node."""
        target = local_path(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{os.getpid()}-{threading.get_ident()}.part"
        try:
            temp.unlink(missing_ok=True)
            os.link(source, temp)
        except OSError:  # another file system, or one without hard links: copy
            return self.put_file(source, uri)
        try:
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return source.stat().st_size

    def copy(self, source: str, uri: str) -> int:
        """A hard link of an object the store holds (objects here are never rewritten in place: a write replaces
        the file), else a copy."""
        return self.link_file(local_path(source), uri)

    def get_file(self, uri: str, target: Path) -> None:
        def copy(out: BinaryIO) -> None:
            with open(local_path(uri), "rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)

        atomic_write(target, copy)

    def read_stream(self, uri: str, start: int = 0, end: int | None = None) -> tuple[int, Iterator[bytes]]:
        source = open(local_path(uri), "rb")  # noqa: SIM115 - closed with the chunks
        size = os.fstat(source.fileno()).st_size
        source.seek(start)
        return size, chunked(source.read, source.close, None if end is None else max(0, end - start))

    def list(self, prefix: str) -> builtins.list[str]:
        root = local_path(prefix)
        if not root.is_dir():
            return []
        base = prefix.rstrip("/")
        return sorted(f"{base}/{p.relative_to(root).as_posix()}" for p in root.rglob("*")
                      if p.is_file() and not p.name.endswith(".part"))

    def list_temp(self, prefix: str) -> builtins.list[str]:
        """Temp files under ``prefix`` (uploads in flight, or left by a writer that was killed): ``list`` hides them."""
        root = local_path(prefix)
        if not root.is_dir():
            return []
        base = prefix.rstrip("/")
        return sorted(f"{base}/{p.relative_to(root).as_posix()}" for p in root.rglob(".*.part") if p.is_file())

    def delete(self, uris: builtins.list[str]) -> None:
        for uri in uris:
            path = local_path(uri)
            path.unlink(missing_ok=True)
            for parent in list(path.parents)[:2]:  # object stores have no folders: leave no empty ones behind
                try:
                    parent.rmdir()
                except OSError:
                    break

    def prune_empty(self, uri: str) -> None:
        """Remove the folders left empty under ``uri`` (and it, if empty): a deleted checkpoint of a script's own
        layout nests deeper than ``delete`` looks up (``step-N/checkpoints/checkpoint_1/``)."""
        root = local_path(uri)
        for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                continue
