"""Mask secrets in everything a node prints, at the source, so no log anywhere holds them: the node log here
(``node-N.log``), CloudWatch / Azure ML / Cloud Logging on clouds (they capture the node's stdout and stderr), and the
per-worker logs torchrun writes, which go to the job's outputs.

The node entry (cloudtrain/node/entry.py) runs this module from the unpacked bundle (``lib/cloudtrain``) right after
the bootstrap's first stage has unpacked it, and routes the node's stdout and stderr through :class:`MaskedOutput`;
every process it starts (pip, torchrun and the workers' output that torchrun echoes, the checkpoint and log
uploaders) inherits the masked descriptors. Standard library only, like the bootstrap itself: nothing is installed
on a node at that point.

What is masked: every value the node's environment marks as secret (by the variable's name or a well-known format,
``secret_values.env_secrets``; the script's secret arguments arrive as such variables too) and every well-known
credential format (``secret_values.VALUE_RULES``), line by line, as ``****``. A line longer than a read (a config
dump, a JSON line over 64 KiB) is passed on in pieces cut only where no secret is cut in two (``Masker.safe_end``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from cloudtrain.node.secret_values import MASK, VALUE_RULES, env_secrets

_BLOCK = 1 << 16
# A long line is let through in pieces cut where no secret is cut in two; a well-known format's match is kept whole
# when it is at most this long (every known format is far shorter). No format's match holds a blank.
_RULE_SPAN = 4096
_BLANKS = (b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c")  # what \s matches in a bytes pattern
_SHORT = 4096
# A read per line would cost more than the line (a chatty worker flushes every line): after a small read, wait this
# long so that the next read takes what came meanwhile. Each line is still passed on as soon as it is read.
_GATHER_SECONDS = 0.002
_PARTIAL_LINE_WAIT = 0.2  # a prompt or a progress bar without a newline is let through after this many seconds
_DRAIN_SECONDS = 5.0  # after the node's work ended, how long output still held open (by an orphan) is read


class Masker:
    """Masks byte blocks that end at a line boundary (so a value is never split between two blocks)."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = [v.encode() for v in values]  # longest first (env_secrets' order): a value inside another
        self._rules = [(re.compile(rule.probe.encode()), re.compile(rule.pattern.encode())) for rule in VALUE_RULES]
        # A short block (a chatty worker's lines often come one per read) is first searched once for anything to
        # mask: a search per value and per rule would cost more than the line. Long blocks go straight to those
        # searches, each of which runs far faster per byte than one search for all.
        probes = [*map(re.escape, self._values), *(rule.probe.encode() for rule in VALUE_RULES)]
        self._anything = re.compile(b"|".join(probes))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Masker:
        return cls(env_secrets(env))

    def __call__(self, data: bytes) -> bytes:
        if len(data) <= _SHORT and not self._anything.search(data):
            return data
        for value in self._values:
            if value in data:
                data = data.replace(value, MASK.encode())
        for probe, regex in self._rules:  # the probe first: ~100x cheaper than the rule on clean text
            if probe.search(data):
                data = regex.sub(_masked_group, data)
        return data

    def blocks(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """Masked output for a stream of raw chunks, cut at line ends ('\\n' or a progress bar's '\\r'). A line
        longer than a block, or one let through before its end (a quiet spell), is cut only where no secret is
        cut in two (:meth:`safe_end`): what may be the start of one waits for the next chunk."""
        pending = b""
        for chunk in chunks:
            if not chunk:  # the writer went quiet mid-line (a prompt, a progress bar): let the line through
                end = self.safe_end(pending, pause=True)
                if end:
                    yield self(pending[:end])
                pending = pending[end:]
                continue
            data = pending + chunk
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if cut == 0:  # no line end yet: wait for it, or let a long line through in safe pieces
                cut = self.safe_end(data) if len(data) >= _BLOCK else 0
                if cut == 0:
                    pending = data
                    continue
            pending = data[cut:]
            yield self(data[:cut])
        if pending:
            yield self(pending)

    def safe_end(self, data: bytes, pause: bool = False) -> int:
        """How much of ``data``, a line whose end is still to come, can be masked and let through now without
        cutting a secret in two. Held back: the start of a registered value that ``data`` ends in; the run of
        non-blank bytes it ends in (no well-known format holds a blank), at most ``_RULE_SPAN`` bytes of it; and any
        whole match the cut would cross. After a ``pause`` (the writer went quiet: a prompt, a progress bar) that
        run is held only if a rule's probe occurs in it, so a quiet partial line still shows whole."""
        end = len(data)
        for value in self._values:
            end = min(end, _partial_start(data, value))
        floor = max(0, len(data) - _RULE_SPAN)
        run = max(floor, *(data.rfind(blank, floor) + 1 for blank in _BLANKS))
        if not pause or any(probe.search(data, run) for probe, _ in self._rules):
            end = min(end, run)
        while True:  # a cut inside a whole match moves to its start, which may lie inside another
            moved = end
            for value in self._values:
                found = data.find(value, max(0, end - len(value) + 1), end + len(value) - 1)
                moved = min(moved, found) if found != -1 else moved
            for probe, regex in self._rules:
                start = max(0, moved - _RULE_SPAN)
                if probe.search(data, start):
                    crossed = (m.start() for m in regex.finditer(data, start) if m.start() < moved < m.end())
                    moved = min([moved, *crossed])
            if moved == end:
                return end
            end = moved

    def mask_file(self, path: Path) -> None:
        """Rewrite a log file masked (replaced atomically: a reader sees the old file or the masked one). On a disk
        with no room for the masked copy (the job's checkpoints filled it), the file is masked in place instead."""
        tmp = path.with_name(path.name + ".masking")
        try:
            with open(path, "rb") as src, open(tmp, "wb") as out:
                for block in self.blocks(iter(lambda: src.read(1 << 20), b"")):
                    out.write(block)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._mask_in_place(path)

    def _mask_in_place(self, path: Path) -> None:
        """Masked bytes written over what was already read, never ahead of it, so no new room is needed but for
        the few bytes a mask longer than what it hides may add at the end. Whatever happens, nothing unmasked is
        left after what was written: the file is cut there."""
        with open(path, "rb") as src, open(path, "r+b", buffering=0) as out:
            held = b""
            try:
                for block in self.blocks(iter(lambda: src.read(1 << 20), b"")):
                    held += block
                    room = src.tell() - out.tell()  # os.write moves out's offset: tell() is where it stands
                    if room > 0:
                        write_all(out.fileno(), held[:room])
                        held = held[room:]
                write_all(out.fileno(), held)
            finally:
                out.truncate(out.tell())

    def mask_tree(self, folder: Path) -> int:
        """Mask every file under ``folder`` (torchrun's per-worker logs); returns how many there were."""
        count = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
            self.mask_file(path)
            count += 1
        return count


def _partial_start(data: bytes, value: bytes) -> int:
    """Where the longest end of ``data`` that is the start of ``value`` (and not all of it) begins; len(data) if
    none."""
    index = data.find(value[:1], max(0, len(data) - len(value) + 1))
    while index != -1:
        if value.startswith(data[index:]):
            return index
        index = data.find(value[:1], index + 1)
    return len(data)


def _masked_group(match: re.Match[bytes]) -> bytes:
    """The match with its secret group (the first that matched) replaced, the rest kept (``AccountKey=****``)."""
    group = next(i for i in range(1, (match.re.groups or 0) + 1) if match.group(i) is not None)
    start = match.start()
    return match.group(0)[:match.start(group) - start] + MASK.encode() + match.group(0)[match.end(group) - start:]


_ACTIVE: list[Masker] = []  # the masker of this process's masked output (MaskedOutput), while it is active


def safe_end(data: bytes, pause: bool = False) -> int:
    """:meth:`Masker.safe_end` by this process's masked output (all of ``data`` when there is none), for a writer to
    it that ends each piece of a long or paused line with a line end of its own (cloudtrain/node/worker_echo.py): a cut
    there would split a secret into two lines, each masked alone."""
    return _ACTIVE[-1].safe_end(data, pause) if _ACTIVE else len(data)


class MaskedOutput:
    """While active, file descriptors 1 and 2 of this process are pipes read by two threads that write masked
    lines to the original stdout and stderr; every child started meanwhile inherits the pipes.

    A partial line (a prompt, a progress bar) waits at most 0.2 s for its end; leaving waits up to 5 s for children
    that still hold the pipes (an orphaned worker), then lets the process go."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker
        self._pumps: list[tuple[int, int, threading.Thread]] = []

    def __enter__(self) -> MaskedOutput:
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            stream.flush()
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._pump, args=(read_end, original), daemon=True,
                                      name=f"cloudtrain-mask-{fd}")
            thread.start()
            self._pumps.append((fd, original, thread))
        _ACTIVE.append(self.masker)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give fds 1 and 2 back and let the pumps write out what is left (also before an ``os._exit``)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        if self.masker in _ACTIVE:
            _ACTIVE.remove(self.masker)
        for fd, original, thread in self._pumps:
            os.dup2(original, fd)  # our write end closes here: the pump sees EOF once no child holds the pipe
            thread.join(_DRAIN_SECONDS)
            if not thread.is_alive():  # else an orphan still writes: the pump keeps its descriptor until exit
                os.close(original)
        self._pumps.clear()

    def _pump(self, read_end: int, out: int) -> None:
        with contextlib.suppress(OSError):
            for block in self.masker.blocks(_chunks(read_end)):
                with contextlib.suppress(OSError):  # a log on a full disk loses this block, and the pipe is
                    write_all(out, block)  # still read: the writers neither block nor break (EPIPE)
        os.close(read_end)


def _chunks(fd: int) -> Iterator[bytes]:
    """Raw chunks from a pipe; an empty chunk after a quiet spell lets a partial line through."""
    waiting = False
    while True:
        if waiting and not select.select([fd], [], [], _PARTIAL_LINE_WAIT)[0]:
            yield b""  # nothing came for a while: Masker.blocks releases the partial line
            waiting = False
            continue
        data = os.read(fd, _BLOCK)
        if not data:
            return
        waiting = not data.endswith((b"\n", b"\r"))
        yield data
        if len(data) < _BLOCK // 4:  # a worker writing line by line: let a few lines gather before the next read
            time.sleep(_GATHER_SECONDS)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (os.write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
