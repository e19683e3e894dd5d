"""The local job record: an embedded SQLite database, so any CLI process (and a later boot) sees every job."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import cloudtrain.providers.local.db_faults as db_faults
from cloudtrain import safe_json
from cloudtrain.errors import HomeError
from cloudtrain.home.errors import os_problem

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    job_dir TEXT NOT NULL,
    grace_period REAL NOT NULL DEFAULT 30,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    supervisor_pid INTEGER,
    supervisor_start INTEGER,
    nodes TEXT NOT NULL DEFAULT '[]',
    plan TEXT NOT NULL DEFAULT '{}',
    lost_at REAL,
    submitter_pid INTEGER,
    submitter_start INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
"""
_JSON_COLUMNS = {"nodes", "plan"}
_T = TypeVar("_T")
# columns newer than the first schema: added to an older database on open
_ADDED_COLUMNS = {"lost_at": "REAL", "submitter_pid": "INTEGER", "submitter_start": "INTEGER"}


@dataclass
class JobRecord:
    id: str
    name: str
    state: str
    job_dir: str
    created_at: float = field(default_factory=time.time)
    message: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    grace_period: float = 30.0
    cancel_requested: int = 0
    attempt: int = 0  # restarts after preemption so far
    supervisor_pid: int | None = None
    supervisor_start: int | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)  # per node: rank, pid, pgid, start, log, exit_code ...
    plan: dict[str, Any] = field(default_factory=dict)  # the plan as submitted (node commands included)
    lost_at: float | None = None  # when status first found the supervisor gone while nodes still ran
    # the process that recorded the job and starts its supervisor: while it lives, a job without one is being started
    submitter_pid: int | None = None
    submitter_start: int | None = None


_COLUMNS = [f.name for f in fields(JobRecord)]


BUSY_SECONDS = 30  # how long a statement waits for another process's lock


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _use_wal(conn: sqlite3.Connection) -> None:
    """WAL mode (it stays with the file once set). Several processes opening a new database at once race to switch
    it, and SQLite answers the loser "database is locked" at once rather than through the busy timeout (it would
    deadlock waiting): it tries again until the file is in WAL mode."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class JobDB:
    """Short transactions in WAL mode: many CLI processes read and write at once without corrupting anything.
    Every failure is one HomeError naming the file (locked past ``BUSY_SECONDS``, a full or read-only disk); a file
    that is not a database any more is set aside, said on stderr, and a new one started."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._migrated = False

    @contextmanager
    def _connect(self, exclusive: bool = False) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_SECONDS * 1000}")
            if exclusive:  # no shared-memory file, which a full disk has no room for: reads only
                conn.execute("PRAGMA locking_mode = EXCLUSIVE")
                yield conn
                return
            _use_wal(conn)
            conn.executescript(_SCHEMA)
            if not self._migrated:
                have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
                for name, kind in _ADDED_COLUMNS.items():
                    if name not in have:
                        with contextlib.suppress(sqlite3.OperationalError):  # another process added it just now
                            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
                self._migrated = True
            yield conn
        finally:
            conn.close()

    def _run(self, work: Callable[[sqlite3.Connection], _T], reads: bool = False) -> _T:
        """``work`` on a fresh connection. A corrupt database is set aside once and ``work`` runs on a new one; a
        read (``reads``) that failed for want of room on the disk runs again in exclusive mode."""
        set_aside = False
        shared_error: sqlite3.Error | None = None  # set: this read runs again in exclusive mode
        while True:
            try:
                with self._connect(exclusive=shared_error is not None) as conn:
                    return work(conn)
            except sqlite3.Error as exc:
                found = db_faults.kind(exc)
                if found == "corrupt" and not set_aside and shared_error is None:
                    set_aside = True
                    db_faults.set_aside(self.path, str(exc))
                    self._migrated = False
                elif reads and shared_error is None and found in ("full", "io", "cannot open") and self.path.is_file():
                    shared_error = exc
                else:
                    raise db_faults.db_problem(shared_error or exc, self.path, BUSY_SECONDS) from None
            except OSError as exc:  # the home folder itself cannot be made
                raise os_problem(exc, self.path.parent, "open the job database") from None

    def _row(self, row: sqlite3.Row | tuple[Any, ...]) -> JobRecord:
        """A record; its JSON columns read with safe_json and checked: one another hand or version left in another
        shape (not JSON, nested 100,000 deep, nodes that are not a list of objects) is a HomeError naming it."""
        values = dict(zip(_COLUMNS, row, strict=True))
        for key, shape in (("nodes", list), ("plan", dict)):
            what = f"the {key} of job {values['id']!r} in the job database {self.path}"
            fix = (f"remove that job's record: sqlite3 {self.path} \"DELETE FROM jobs WHERE id = '{values['id']}'\" "
                   "(its files stay in its job folder)")
            text = values[key]
            try:
                found = safe_json.loads(text, what) if isinstance(text, (str, bytes)) else None
            except safe_json.UnreadableJson as exc:
                raise HomeError(exc.message, remedy=fix) from None
            if not isinstance(found, shape) or (shape is list and not all(isinstance(n, dict) for n in found)):
                wanted = "a list of objects" if shape is list else "an object"
                raise HomeError(f"{what} is {_shown(text)}, not {wanted}", remedy=fix)
            values[key] = found
        return JobRecord(**values)

    def insert(self, record: JobRecord) -> bool:
        """Insert a new job; False (and no change) if the id exists already, which makes submit idempotent."""
        values = [json.dumps(getattr(record, c)) if c in _JSON_COLUMNS else getattr(record, c) for c in _COLUMNS]
        sql = f"INSERT OR IGNORE INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        return self._run(lambda conn: conn.execute(sql, values).rowcount == 1)

    def get(self, job_id: str) -> JobRecord | None:
        row = self._run(lambda conn: conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?",
                                                  (job_id,)).fetchone(), reads=True)
        return self._row(row) if row else None

    def update(self, job_id: str, *, only_if_state: tuple[str, ...] = (), **changes: Any) -> bool:
        """Update fields; with ``only_if_state`` the change applies only while the job is in one of those states."""
        return self.update_where(job_id, {"state": only_if_state} if only_if_state else {}, **changes)

    def update_where(self, job_id: str, where: dict[str, Any], **changes: Any) -> bool:
        """Update fields only while the record holds ``where`` (column -> value; a tuple: one of those values; None:
        unset), in one statement: a claim two processes may race for. Never queued (SteadyDB): its answer counts."""
        values = [json.dumps(v) if k in _JSON_COLUMNS else v for k, v in changes.items()]
        tests, params = [], []
        for column, value in where.items():
            if isinstance(value, tuple):
                tests.append(f"{column} IN ({', '.join('?' * len(value))})")
                params += list(value)
            else:
                tests.append(f"{column} IS ?")
                params.append(json.dumps(value) if column in _JSON_COLUMNS and value is not None else value)
        sql = (f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in changes)} WHERE id = ?"
               + "".join(f" AND {t}" for t in tests))
        return self._run(lambda conn: conn.execute(sql, [*values, job_id, *params]).rowcount == 1)

    def list(self, limit: int = 50) -> list[JobRecord]:
        rows = self._run(lambda conn: conn.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall(),
            reads=True)
        return [self._row(r) for r in rows]
