"""A small object-storage layer over ``str`` URIs.

Writes are atomic: an object is either absent or complete (temp file + rename on file://). Only file:// lives
here today; the cloud schemes plug in behind the same functions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from cloudtrain.errors import UserError


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def local_path(uri: str) -> Path:
    """The local path behind a ``file://`` URI (or a plain path)."""
    if "://" not in uri:
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise UserError(
            f"{uri!r}: the {parsed.scheme}:// store is not supported by this version of cloudtrain",
            remedy="use a file:// URI for now",
        )
    if parsed.netloc not in ("", "localhost"):
        raise UserError(f"{uri!r} names a host; file URIs must be file:///absolute/path",
                        remedy="write three slashes: file:///path/to/dir")
    return Path(unquote(parsed.path))


def exists(uri: str) -> bool:
    return local_path(uri).exists()


def read_bytes(uri: str) -> bytes:
    return local_path(uri).read_bytes()


def _atomic_write(target: Path, writer: Callable[[BinaryIO], object]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            writer(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(uri: str, data: bytes) -> None:
    _atomic_write(local_path(uri), lambda out: out.write(data))


def put_file(source: Path, uri: str) -> int:
    """Upload a local file; returns the bytes written."""

    def copy(out: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1024 * 1024)

    _atomic_write(local_path(uri), copy)
    return source.stat().st_size
