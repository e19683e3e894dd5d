"""One reader for every JSON file cloudtrain reads back (leases, lineage, manifests, job records, measured figures,
events): whatever another process, a crash or a hostile hand left there, reading it gives a value or one
``UnreadableJson`` that names the file and the fix, never a RecursionError or a MemoryError from deep down.

Limits: ``MAX_BYTES`` (a state file is kilobytes; 64 MiB is far past any cloudtrain writes) and ``MAX_DEPTH``
(cloudtrain's own documents nest a few levels; json's C scanner recurses once per level and fails at Python's
recursion limit, ~1,000, with a RecursionError that may be raised far from here). Standard library only, Python 3.8:
the node side reads its manifests and leases with it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Union

from cloudtrain.errors import CloudtrainError

MAX_BYTES = 64 << 20
MAX_DEPTH = 64
_OPENERS = frozenset(b"[{")
_CLOSERS = frozenset(b"]}")

Text = Union[str, bytes, bytearray]


class UnreadableJson(CloudtrainError, ValueError):
    """A JSON file cloudtrain wrote is not the JSON it wrote: cut short, nested too deeply, too large, not JSON.
    A ValueError too, so code that already treats a garbled file as missing keeps doing so."""


def _too_deep(data: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than ``limit`` (a linear scan: only run on documents that have
    more opening brackets than ``limit``, which cloudtrain's own never have)."""
    depth, in_string, escaped = 0, False, False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPENERS:
            depth += 1
            if depth > limit:
                return True
        elif byte in _CLOSERS:
            depth -= 1
    return False


def loads(text: Text, what: str, *, max_depth: int = MAX_DEPTH, remedy: str | None = None) -> Any:
    """The document in ``text``; ``what`` names it in the error (a path, ``the lease of s3://b/run``)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    fix = remedy or f"delete or restore {what}: cloudtrain writes it again"
    if len(data) > MAX_BYTES:
        raise UnreadableJson(f"{what} is {len(data):,} bytes, more than cloudtrain ever writes there", remedy=fix)
    if data.count(b"[") + data.count(b"{") > max_depth and _too_deep(data, max_depth):
        raise UnreadableJson(f"{what} nests deeper than {max_depth} levels: it is not a file cloudtrain wrote",
                             remedy=fix)
    try:
        return json.loads(data)
    except RecursionError:  # within the limit above but past the interpreter's (a deep call stack already)
        raise UnreadableJson(f"{what} nests too deeply to read", remedy=fix) from None
    except ValueError as exc:  # not JSON, cut short, not UTF-8
        raise UnreadableJson(f"{what} is not valid JSON ({str(exc)[:200]})", remedy=fix) from None


def load(path: str | os.PathLike[str], what: str | None = None, *, max_depth: int = MAX_DEPTH,
         remedy: str | None = None) -> Any:
    """The document in the file at ``path``. A missing file is the caller's FileNotFoundError (most callers treat it
    as "none yet"); any other OSError, and anything ``loads`` refuses, is an ``UnreadableJson``."""
    name = what or str(path)
    try:  # O_NONBLOCK: a FIFO left in a file's place is refused below, not waited on for ever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnreadableJson(f"{name} is not a regular file", remedy=remedy or f"remove {path}")
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableJson(f"cannot read {name}: {exc.strerror or exc}",
                             remedy=remedy or f"check the permissions of {path}") from None
    return loads(data, name, max_depth=max_depth, remedy=remedy)

