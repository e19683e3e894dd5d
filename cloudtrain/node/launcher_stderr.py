"""torchrun's own stderr, passed on to the node's line by line and kept whole in ``torchrun.log`` beside the worker
logs (uploaded with them), less the noise of torchrun's own teardown at the end of a node that stopped or succeeded.

That noise, all of it torch's: the ``SignalException`` traceback torchrun prints when the node forwards it a stop (a
preemption, a cancel, the watchdog); c10d's warnings, each with its C++ frames, when a peer's rendezvous store went
away first (node 0 hosts it: its agent may exit before the others are done) and the rendezvous' own line about it
("has failed to send a keep-alive heartbeat"); and a torchrun that aborts while it shuts down ("terminate called
without an active exception", then faulthandler's "Fatal Python error: Aborted" and its thread dump). It says
nothing the node's own last line does not say better, yet it filled more than half of a rehearsed preemption's log.

The lines come from several threads of torchrun at once: the main thread's traceback, the keep-alive thread's c10d
warning and the agent's log lines interleave, the more so on a busy machine. So nothing here depends on their order:
such lines are held while their fate is open (a store warning until another line of torchrun's shows that the run
went on, a traceback or an abort until torchrun's stderr ends), and decided once torchrun has exited: after a stop
of the node's, or when torchrun exited 0, they are teardown noise (``torchrun.log`` keeps them); when torchrun failed
on its own they are shown whole. Any other traceback (one with an exception besides the stop's ``SignalException``,
chained to it or not) and any other line is always shown. Standard library only: nodes run it under the image's
Python (3.8 and up).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path
from typing import IO

from cloudtrain.node.log_masking import write_all

TRACEBACK = b"Traceback (most recent call last):"
# c10d's warning when the store's socket fails (a peer's store went away), then its C++ stack, ended by a blank line
_STORE_WARNING = re.compile(rb"^\[[WE]\d{4} [\d:.]+ \S+\] \[c10d\] ")
_STORE_STACK = re.compile(rb"^(Exception raised from |frame #\d+: |<omitting python frames>)")
# the rendezvous' own line about the same store gone (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py)
_RENDEZVOUS_LOST = re.compile(rb"^[WE]\d{4} .*\] The node '[^']*' has failed to (send a keep-alive heartbeat to|"
                              rb"shutdown) the rendezvous ")
# an abort in torch's teardown (a C++ thread still joinable, a daemon thread ended inside C++), then faulthandler's
# dump (torchrun's @record enables it): the process's last words
_ABORT = re.compile(rb"^(terminate called |Fatal Python error: Aborted)")
_CHAINED = (b"During handling of the above exception, another exception occurred:",
            b"The above exception was the direct cause of the following exception:")
_STOP_EXCEPTION = b"SignalException"


def _is_store_noise(line: bytes) -> bool:
    return bool(_STORE_WARNING.match(line) or _STORE_STACK.match(line) or _RENDEZVOUS_LOST.match(line))


def _blank(line: bytes) -> bool:
    return not line.strip()


def _chain(lines: list[bytes], start: int) -> tuple[int, list[int] | None]:
    """(the index after the traceback chain starting at ``start``, the indexes of its exceptions' lines, None where
    the lines end before the last: cut short by an abort): tracebacks joined by Python's "During handling ..." or
    "The above exception was the direct cause ..."."""
    i, exceptions = start, []
    while True:
        i += 1
        while i < len(lines) and lines[i][:1] in (b" ", b"\t"):  # its frames
            i += 1
        if i == len(lines):
            return i, None
        exceptions.append(i)
        i += 1
        k = i
        while k < len(lines) and _blank(lines[k]):
            k += 1
        if k < len(lines) and lines[k].rstrip() in _CHAINED:
            k += 1
            while k < len(lines) and _blank(lines[k]):
                k += 1
            if k < len(lines) and lines[k].startswith(TRACEBACK):
                i = k
                continue
        return i, exceptions


def teardown_filtered(held: list[bytes]) -> list[bytes]:
    """What to show of the lines held at the end of a node that stopped torchrun or whose torchrun succeeded: not
    the store's noise (wherever it fell, in a traceback too), not an abort and what follows it, not a traceback (or
    a chain of them) of the stop's SignalException alone or cut short by an abort; anything else, in its order."""
    kept: list[bytes] = []
    after_noise = False
    for line in held:
        if _ABORT.match(line):
            break  # torchrun aborted in its teardown: all that follows is faulthandler's account of its threads
        noise = _is_store_noise(line) or (after_noise and _blank(line))  # a c10d stack ends with a blank line
        after_noise = noise
        if not noise:
            kept.append(line)
    shown: list[bytes] = []
    i = 0
    while i < len(kept):
        if not kept[i].startswith(TRACEBACK):
            shown.append(kept[i])
            i += 1
            continue
        end, exceptions = _chain(kept, i)
        # the stop's alone (or cut short: torchrun died in its teardown) is noise; one with another exception is not
        if exceptions is not None and not all(_STOP_EXCEPTION in kept[e] for e in exceptions):
            shown += kept[i:end]
        i = end
    return shown


class LauncherStderr:
    """torchrun's stderr, passed on to the node's (``out``) and kept whole in ``raw``, less its teardown noise (see
    the module's docstring): :meth:`stopping` when the node forwards a stop, :meth:`finish` with torchrun's exit
    code once it has exited."""

    def __init__(self, raw: Path, out: int = 2) -> None:
        self.raw, self.out = raw, out
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the held lines: the reader thread's, until finish() decides them
        self._held: list[bytes] = []
        self._ending = False  # a traceback after a stop, or an abort: held until torchrun's stderr ends
        self._decided = False  # finish() has written what was held: later lines (an orphan's) go straight out

    @classmethod
    def for_torchrun(cls, argv: list[str]) -> LauncherStderr | None:
        """For the torchrun command line ``argv``: ``torchrun.log`` beside the worker logs of its ``--log-dir``."""
        if "--log-dir" not in argv:
            return None
        folder = Path(argv[argv.index("--log-dir") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        return cls(folder / "torchrun.log")

    def start(self, pipe: IO[bytes]) -> None:
        self._thread = threading.Thread(target=self._run, args=(pipe,), name="cloudtrain-torchrun-stderr",
                                        daemon=True)
        self._thread.start()

    def stopping(self) -> None:
        """The node forwards a stop to torchrun (called before the signal is sent)."""
        self._stopping = True

    def finish(self, code: int | None = None, timeout: float = 5.0) -> None:
        """After torchrun exited with ``code`` (None: unknown): its last lines written, the held ones decided (a
        worker it orphaned may hold the pipe: not waited for beyond ``timeout``)."""
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            if self._decided:
                return
            self._decided = True
            held, self._held = self._held, []
        quiet_end = self._stopping or code == 0  # else torchrun failed on its own: everything it said is shown
        self._write(b"".join(teardown_filtered(held) if quiet_end else held))

    def _run(self, pipe: IO[bytes]) -> None:
        try:
            raw = os.open(self.raw, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            raw = -1
        with pipe:  # drained to its end whatever fails: torchrun must never block on a full pipe
            for line in iter(pipe.readline, b""):
                if raw >= 0:
                    with contextlib.suppress(OSError):
                        write_all(raw, line)
                with self._lock:
                    out = line if self._decided else self._take(line)
                self._write(out)
        if raw >= 0:
            os.close(raw)

    def _take(self, line: bytes) -> bytes:
        """What to write now for ``line``, holding what may be teardown noise (under the lock)."""
        if self._ending or _ABORT.match(line) or (self._stopping and line.startswith(TRACEBACK)):
            self._ending = True  # torchrun is ending: the rest is decided at its end
        elif not (_is_store_noise(line) or (self._held and _blank(line))):
            if not self._stopping:  # the run went on after a store warning: it was no teardown's
                out, self._held = b"".join(self._held) + line, []
                return out
            return line  # after a stop, held noise stays held, whatever torchrun says meanwhile
        self._held.append(line)
        return b""

    def _write(self, data: bytes) -> None:
        if data:
            with contextlib.suppress(OSError):
                write_all(self.out, data)
