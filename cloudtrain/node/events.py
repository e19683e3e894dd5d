"""A job's timeline events, as the node and its workers tell them: one machine-readable line per event in the node's
log (``cloudtrain-event {"e": "restored", "t": 1767225600.1, ...}``). The log is the one channel the client already
reads on every provider, and the node masks every line of it (log_masking), so an event never carries a secret out.
The client picks the lines out of the logs it fetches (cloudtrain/home/timeline.py); a line cut short is counted as
missing there, never an error. Standard library only, Python 3.8: the bootstrap, the node steps and the workers
import it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
from typing import Any

from cloudtrain import contract

PREFIX = "cloudtrain-event "
STEP_SECONDS = contract.STEP_REPORT_SECONDS  # at most one step event per this many seconds (default 2)


def line(kind: str, **fields: Any) -> str:
    """The log line for one event (``t``: this machine's clock now, seconds since the epoch, unless ``fields`` say
    when it happened)."""
    return PREFIX + json.dumps({"e": kind, "t": round(time.time(), 3), **fields}, separators=(",", ":"),
                               default=str)


def emit(kind: str, **fields: Any) -> None:
    """Print one event to this process's stdout (the node log). Never raises: an event is worth less than the job."""
    with contextlib.suppress(OSError, ValueError):
        print(line(kind, **fields), flush=True)


def parse(text: str) -> dict[str, Any] | None:
    """The event on one log line (after any prefix the log adds: ``[node0]``, a worker's rank), None when the line
    holds none, ``{}`` for one cut short or garbled."""
    at = text.find(PREFIX)
    if at < 0:
        return None
    from cloudtrain import safe_json  # the reading side's only (workers emit)

    try:  # any line a worker printed: one nested 100,000 deep is garbled, never a RecursionError
        event = safe_json.loads(text[at + len(PREFIX):], "an event line")
    except ValueError:  # safe_json.UnreadableJson
        return {}
    if not isinstance(event, dict) or not isinstance(event.get("e"), str) or \
            not isinstance(event.get("t"), (int, float)) or isinstance(event.get("t"), bool):
        return {}
    return event


class StepReporter:
    """``report(step, total)`` emits a ``step`` event for the first step, then at most one per STEP_SECONDS: enough
    for progress and steps/s, never a line per step; the last step reported is emitted when the process exits, so a
    finished run ends at its last step. Only rank 0 speaks (every rank is at the same step). ``data_s``: seconds the
    step waited for its data, summed into the next event (goodput's data loading)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.every = _seconds(os.environ.get(STEP_SECONDS), 2.0)
        self.rank0 = os.environ.get("RANK", "0") == "0"
        self.pending: dict[str, Any] | None = None  # the newest step not emitted yet
        self.data_s = 0.0
        if self.rank0:
            atexit.register(self.flush)

    def report(self, step: int, total: int | None = None, data_s: float | None = None) -> None:
        if not self.rank0:
            return
        fields: dict[str, Any] = {"step": int(step)}
        if total is not None:
            fields["total"] = int(total)
        if data_s is not None and 0 <= data_s < float("inf"):
            self.data_s += float(data_s)
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every:
            self.pending = {**fields, "t": round(time.time(), 3)}  # dated when reported, if emitted at exit
            return
        self.last = now
        self._emit(fields)

    def flush(self) -> None:
        """Emit the newest step reported since the last event, if any (at exit: the run's last step)."""
        if self.pending is not None:
            self._emit(self.pending)

    def _emit(self, fields: dict[str, Any]) -> None:
        self.pending = None
        if self.data_s > 0:
            fields = {**fields, "data_s": round(self.data_s, 3)}
            self.data_s = 0.0
        emit("step", **fields)


def _seconds(text: str | None, default: float) -> float:
    try:
        return max(0.0, float(text)) if text else default
    except ValueError:
        print(f"[cloudtrain] warning: {STEP_SECONDS}={text!r} is not a number of seconds; using {default:g}",
              file=sys.stderr)
        return default
