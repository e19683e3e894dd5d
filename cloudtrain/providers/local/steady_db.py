"""The supervisor's hold on the job database while the home's disk fills or another process holds the lock past the
wait: the job goes on, a write that fails is queued and made with the next one (a reserve file written at start is
given up first, to make room), and the job's last message says the disk filled, so ``status`` tells what happened
instead of a supervisor that died without a word."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from cloudtrain.errors import HomeError
from cloudtrain.home.errors import FULL_BYTES, free_bytes
from cloudtrain.providers.local.db_faults import DatabaseLocked
from cloudtrain.providers.local.jobdb import JobDB, JobRecord

RESERVE_NAME = ".space-reserve"  # in the job's folder, on the job database's disk
RESERVE_BYTES = 1024 * 1024  # room for SQLite's shared-memory file (32 KiB) and a few pages of its log
SETTLE_SECONDS = 60.0  # at the end: how long a record that cannot be written yet is tried again


class SteadyDB(JobDB):
    def __init__(self, path: Path, reserve: Path | None = None) -> None:
        super().__init__(path)
        self.reserve = reserve
        self.queued: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
        self.filled = False  # the disk was seen full during the job: its last message says so
        self._last_said = ""
        if reserve is not None:
            with contextlib.suppress(OSError), open(reserve, "wb") as out:
                out.write(bytes(RESERVE_BYTES))  # written, not sparse: the blocks are held
                out.flush()
                os.fsync(out.fileno())

    def get(self, job_id: str) -> JobRecord | None:
        """The record, or None while it cannot be read (said in the supervisor's log)."""
        for _ in range(2):
            try:
                return super().get(job_id)
            except HomeError as exc:
                self._say(exc)
                if not self._make_room(exc):
                    break
        return None

    def update(self, job_id: str, *, only_if_state: tuple[str, ...] = (), **changes: Any) -> bool:
        """As JobDB's; a change that cannot be written now is queued (in order) and counts as made."""
        if 0 <= free_bytes(self.path) < FULL_BYTES:
            self.filled = True
        if self.filled and "ended_at" in changes:
            changes["message"] = self.filled_note(str(changes.get("message") or ""))
        self.queued.append((job_id, only_if_state, changes))
        return self._flush()

    def filled_note(self, message: str) -> str:
        note = (f"the disk holding {self.path.parent} filled up during the job (node logs and status files may be "
                "cut short): free space there, or set CLOUDTRAIN_HOME to a disk with room")
        return f"{message}; {note}" if message else note

    def _flush(self) -> bool:
        made = True
        while self.queued:
            job_id, states, changes = self.queued[0]
            try:
                made = super().update(job_id, only_if_state=states, **changes)
            except HomeError as exc:
                self._say(exc)
                if self._make_room(exc):
                    continue
                return True
            self.queued.pop(0)
        return made

    def _make_room(self, exc: HomeError) -> bool:
        """Give up the reserve for a write a full disk refused: True if that made room to try again."""
        if isinstance(exc, DatabaseLocked) or self.reserve is None or not self.reserve.exists():
            return False
        self.filled = True
        with contextlib.suppress(OSError):
            self.reserve.unlink()
        return True

    def settle(self) -> None:
        """At the supervisor's end: write what is queued (tried again for SETTLE_SECONDS), give the reserve back."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.queued and time.monotonic() < deadline:
            self._flush()
            if self.queued:
                time.sleep(1.0)
        if self.queued:
            self._say(HomeError(f"{len(self.queued)} change(s) to the job's record could not be written; its "
                                "status is judged from the nodes' own files once the database can be read"))
        if self.reserve is not None:
            with contextlib.suppress(OSError):
                self.reserve.unlink(missing_ok=True)

    def _say(self, exc: HomeError) -> None:
        """Once per distinct message, in the supervisor's log (which may itself be on the full disk)."""
        if exc.render() != self._last_said:
            self._last_said = exc.render()
            with contextlib.suppress(OSError, ValueError):
                print(f"[cloudtrain] supervisor: {exc.render()}", file=sys.stderr, flush=True)
