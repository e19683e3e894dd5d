"""One reader for every JSON file cloudtrain reads back (leases, lineage, manifests, job records, measured figures,
events): whatever another process, a crash or a hostile hand left there, reading it gives a value or one
``UnreadableJson`` that names the file and the fix, never a RecursionError or a MemoryError from deep down.

Limits: ``MAX_BYTES`` (a state file is kilobytes, a manifest of a million files about 130 MB: 256 MiB is past any
cloudtrain writes) and ``MAX_DEPTH`` (cloudtrain's own documents nest a few levels; json's C scanner recurses once
per level and fails at Python's recursion limit, ~1,000, with a RecursionError that may be raised far from here).
Standard library only, Python 3.8: the node side reads its manifests and leases with it.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
from array import array
from typing import Any, Union

from cloudtrain.errors import CloudtrainError

MAX_BYTES = 256 << 20
MAX_DEPTH = 64
_NOT_QUOTE_OR_BRACKET = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_STEPS = bytes.maketrans(b"[]", b"\x01\xff")  # as signed bytes: +1, -1
_PASSES = 4  # cloudtrain's own documents are gone after these; what is left is summed up

Text = Union[str, bytes, bytearray]


class UnreadableJson(CloudtrainError, ValueError):
    """A JSON file cloudtrain wrote is not the JSON it wrote: cut short, nested too deeply, too large, not JSON.
    A ValueError too, so code that already treats a garbled file as missing keeps doing so."""


def _too_deep(data: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than ``limit``: exact for JSON, and for anything else a guess
    either way (json then refuses it). Each step runs in C over the whole data, none ever retried: a manifest of
    100,000 files is scanned in a fraction of its parse, and a crafted document costs a few passes over it."""
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then escaped quotes, go
    data = data.translate(None, _NOT_QUOTE_OR_BRACKET)  # what is left of each string: its quotes, its brackets
    data = data.replace(b'""', b"")  # the strings without a bracket (two quotes in a row: nothing changes sides)
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])  # the strings with one: every other piece is inside one
    brackets = data.translate(_ONE_KIND)
    if b"[" * (limit + 1) in brackets:  # the usual attack, at once
        return True
    passes = 0  # each takes the innermost pairs: what a JSON document keeps nests one level less
    while brackets and passes < _PASSES:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):  # no pair left: closers, then openers; not JSON (json says so)
            return brackets.count(b"[") + passes > limit
        brackets, passes = inner, passes + 1
    deepest = max(itertools.accumulate(array("b", brackets.translate(_STEPS))), default=0)  # +1 [, -1 ]
    return deepest + passes > limit


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
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):  # a folder too (before open() below says "Is a directory")
                raise UnreadableJson(f"{name} is not a regular file", remedy=remedy or f"remove {path}")
            if found.st_size > MAX_BYTES:  # refused unread (a sparse file of terabytes costs nothing)
                raise UnreadableJson(f"{name} is {found.st_size:,} bytes, more than cloudtrain ever writes there",
                                     remedy=remedy or f"delete or restore {name}: cloudtrain writes it again")
            with open(fd, "rb", closefd=False) as f:
                data = f.read(MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableJson(f"cannot read {name}: {exc.strerror or exc}",
                             remedy=remedy or f"check the permissions of {path}") from None
    return loads(data, name, max_depth=max_depth, remedy=remedy)

