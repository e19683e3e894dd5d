"""The workers' output in the node's own: each line of each worker's stdout and stderr, prefixed with its local rank
as torchrun's ``--tee`` does (``[default0]:``), read from the files torchrun writes for them with ``--redirects 3
--log-dir`` (``<log dir>/<run>/attempt_<n>/<local rank>/std{out,err}.log``, uploaded as the job's logs).

torchrun's own tee follows those files with a thread per file that polls every 0.1 s, and torchrun waits for those
threads before it exits: ~0.15 s at the end of every job and every preemption. The bootstrap follows them here
instead, and once torchrun has exited reads what is left at once. Lines are passed on as bytes (the node's masked
output masks them), a carriage return ends a line as in torchrun's text-mode reading, and a partial line is let
through after a quiet spell so that a prompt or a progress bar still shows. torchrun's own stderr reaches the
node's through cloudtrain/node/launcher_stderr.py. Standard library only: nodes run it under the image's Python
(3.8 and up).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path

from cloudtrain.node.log_masking import safe_end, write_all

ROLE = "default"  # torchrun's worker role: its prefix is [<role><local rank>]:
STREAMS = {"stdout.log": 1, "stderr.log": 2}  # each file is echoed to the node's own stream of that name
PARTIAL_LINE_POLLS = 2  # polls without new bytes before a partial line is let through
MAX_LINE = 1 << 20  # bytes without a line end that are let through as a piece of one
READ_SIZE, READS_PER_POLL = 1 << 20, 8  # a chatty worker cannot hold up the others for long, nor fill memory
_LINE_END = re.compile(rb"\r\n|\r|\n")
_PIPE_BUF = 4096  # writes up to this size reach a pipe whole: no line of ours is cut by another writer's


class _Followed:
    def __init__(self, path: Path, prefix: bytes, out: int) -> None:
        self.path, self.prefix, self.out = path, prefix, out
        self.fd = -1
        self.pending = b""  # the start of a line whose end has not been written yet
        self.quiet = 0  # polls since the last new bytes
        self.after_cr = False  # the last line let through ended with a held \r: a \n that follows belongs to it


class WorkerEcho:
    """Echo the worker logs of torchrun runs that start under ``log_dir`` from now on (those already there belong
    to an earlier attempt on this node) to ``outs`` (file name -> descriptor; fds 1 and 2 by default)."""

    def __init__(self, log_dir: Path, interval: float = 0.1, outs: dict[str, int] | None = None) -> None:
        self.log_dir, self.interval, self.outs = log_dir, interval, outs or STREAMS
        self._earlier = set(self._runs())
        self._followed: dict[Path, _Followed] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one reader at a time: the thread's polls, the last read in finish()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="cloudtrain-worker-echo", daemon=True)

    def start(self) -> WorkerEcho:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Everything written so far, partial last lines ended; then no more (torchrun has exited). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        with self._lock:
            if self._finished:
                return
            self._finished = True
            with contextlib.suppress(OSError):  # best effort: the files stay on the node and in the uploaded logs
                self._poll(final=True)
            for f in self._followed.values():
                if f.fd >= 0:
                    os.close(f.fd)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._finished:
                    return
                with contextlib.suppress(OSError):  # a folder removed or unreadable for a moment: the next poll tries
                    self._poll(final=False)

    def _runs(self) -> list[str]:
        try:
            return [e.name for e in os.scandir(self.log_dir) if e.is_dir()]
        except OSError:
            return []

    def _discover(self) -> None:
        for run in self._runs():
            if run in self._earlier:
                continue
            for attempt in sorted((self.log_dir / run).glob("attempt_*")):
                for rank_dir in attempt.iterdir():
                    if not rank_dir.name.isdigit():
                        continue
                    for name, out in self.outs.items():
                        path = rank_dir / name
                        if path not in self._followed and path.is_file():
                            prefix = f"[{ROLE}{rank_dir.name}]:".encode()
                            self._followed[path] = _Followed(path, prefix, out)

    def _poll(self, final: bool) -> None:
        self._discover()
        for f in sorted(self._followed.values(), key=lambda f: (f.out, f.path)):
            if f.fd < 0:
                f.fd = os.open(f.path, os.O_RDONLY)
            reads = 0
            while final or reads < READS_PER_POLL:  # to the end at last; else a bounded share per poll
                data = os.read(f.fd, READ_SIZE)
                if not data:
                    break
                reads += 1
                self._echo(f, data, last=False)
            f.quiet = 0 if reads else f.quiet + 1
            if f.pending and (final or f.quiet >= PARTIAL_LINE_POLLS):
                self._echo(f, b"", last=True, whole=final)

    @staticmethod
    def _echo(f: _Followed, data: bytes, last: bool, whole: bool = False) -> None:
        """Write the lines ``data`` completes; ``last``: a partial line too (the file ended, or went quiet), all of
        it when ``whole`` (the file ended)."""
        if f.after_cr and data:
            f.after_cr, data = False, data[data.startswith(b"\n"):]
        buf = f.pending + data
        hold = b"\r" if buf.endswith(b"\r") and not last else b""  # its \n may be the next read's first byte
        lines = _LINE_END.split(buf[:len(buf) - len(hold)])
        f.pending = lines.pop() + hold  # what follows the last line end: b"" or the start of a line
        if last or len(f.pending) > MAX_LINE:  # a line never ended (binary output) is let through in pieces
            f.after_cr = last and buf.endswith(b"\r")
            # ... each piece a line of its own: never cut inside a secret, which the node's masked output would miss
            cut = len(f.pending) if whole else safe_end(f.pending, pause=last)
            if cut:
                lines.append(f.pending[:cut])
                f.pending = f.pending[cut:]
        if lines:
            _write_lines(f.out, [f.prefix + line + b"\n" for line in lines])


def _write_lines(fd: int, lines: list[bytes]) -> None:
    """``lines`` to ``fd`` in writes of whole lines (up to a pipe's atomic size where lines allow)."""
    block = b""
    for line in lines:
        if block and len(block) + len(line) > _PIPE_BUF:
            write_all(fd, block)
            block = b""
        block += line
    if block:
        write_all(fd, block)
