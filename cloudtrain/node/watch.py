"""What a node's bootstrap watches while its job runs, on every provider: the local supervisor (a node never outlives
it), the ``max_idle`` watchdog (a hung job is stopped), and what the workers left behind (did they join a process
group, why did they fail). The node entry (cloudtrain/node/entry.py) runs it from the bundle's ``lib/`` once the
bootstrap's first stage has unpacked the bundle. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudtrain import contract
from cloudtrain.node import diagnosis, idle_watchdog, rank_report
from cloudtrain.node.durations import format_duration

SUPERVISOR_FD = contract.SUPERVISOR_FD  # local nodes: the read end of a pipe the supervisor holds open
GRACE_ENV = contract.GRACE_PERIOD  # seconds between this node's own SIGTERM and its SIGKILL
EXIT_FAILED = contract.EXIT_FAILED


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def kill_descendants(sig: int = signal.SIGKILL) -> int:
    """Signal every process below this one (torchrun, its workers in sessions of their own, pip ...), found through
    /proc's parent links and all collected before any is signalled (a killed parent's children get re-parented).
    Without /proc (macOS) nothing is found."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    return len(found)


class NodeWatch:
    """Stops the node on its own when its supervisor is gone or it sat idle for ``max_idle``: the first reason wins,
    the bootstrap's main thread gets SIGTERM (forwarded to torchrun, as a platform's stop would be, so workers may
    save), and whatever still runs under the node ``grace`` seconds later is killed; ``on_force(reason)`` records
    that, and the process exits 1."""

    def __init__(self, env: dict[str, str], workdir: Path, on_force: Callable[[str], None]) -> None:
        self.env, self.workdir, self.on_force = env, workdir, on_force
        self.grace = float(env.get(GRACE_ENV) or 30)
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._idle: threading.Event | None = None
        self.stop_file = env.pop(contract.STOP_REASON_FILE, "")  # the workers need not know it
        fd = env.pop(SUPERVISOR_FD, "")  # never passed on: only the bootstrap watches the pipe
        if fd.isdigit():
            threading.Thread(target=self._watch_supervisor, args=(int(fd),), name="cloudtrain-supervisor-watch",
                             daemon=True).start()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        log(f"stopping this node: {reason}")
        timer = threading.Timer(self.grace, self._force)
        timer.daemon = True
        timer.start()
        # to the main thread itself, so that its wait for torchrun is interrupted and its handler forwards it
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    def _force(self) -> None:
        killed = kill_descendants()
        log(f"still running {self.grace:g}s after stopping: killed {killed} process(es) of this node")
        self.on_force(str(self.reason))
        os._exit(EXIT_FAILED)

    def _watch_supervisor(self, fd: int) -> None:
        """A read returns end-of-file once the supervisor holding the write end is gone, however it died. On a cloud
        no one sets the variable: the platform stops its nodes itself."""
        try:
            while os.read(fd, 64):
                pass
        except OSError as exc:  # not a pipe we were given: watch nothing rather than stop a healthy node
            log(f"warning: cannot watch the supervisor ({exc})")
            return
        self.stop("its supervisor is gone (killed, or out of memory), so nothing would record the job's end")

    def torchrun_started(self) -> dict[str, str]:
        """Start the ``max_idle`` watchdog if the job asked for one (worker logs and checkpoint folder); return what
        torchrun's environment adds: the folder where each worker reports whether it joined a process group."""
        reports = self.workdir / "ranks"
        shutil.rmtree(reports, ignore_errors=True)  # a restarted node reports afresh
        limit = idle_watchdog.idle_limit(self.env)
        # Only the node of global rank 0 watches: it is where a job prints (most scripts print from rank 0 alone)
        # and where plain checkpoints are written. When it stops, the platform (or the local supervisor) ends the
        # other nodes.
        if limit is not None and self.env.get(contract.NODE_RANK, "0") == "0":
            folders = [self.workdir / "worker-logs", Path(self.env.get(contract.CHECKPOINT_DIR) or self.workdir)]
            self._idle = idle_watchdog.start(folders, limit, self.stop)
        elif limit is None and self.env.get(idle_watchdog.ENV):
            log(f"warning: {idle_watchdog.ENV}={self.env[idle_watchdog.ENV]!r} is not a number of seconds: no watchdog")
        return {rank_report.ENV: str(reports)}

    def torchrun_ended(self) -> None:
        if self._idle is not None:
            self._idle.set()

    @staticmethod
    def took(seconds: float) -> str:
        """A node's run time as people write it: ``42s``, ``1h3m``."""
        return format_duration(seconds)

    def stopped_by(self) -> str | None:
        """Why this node was stopped, where whoever stopped it said and it was no preemption (the local supervisor:
        'node 1 failed', 'cancelled by user'); None: a preemption, or nobody said."""
        if not self.stop_file:
            return None
        try:
            return Path(self.stop_file).read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def findings(self, outcome: str, gpus: int) -> dict[str, Any]:
        """What the node's status adds: the stop reason, the rank reports, and why its workers failed or idled. With
        CLOUDTRAIN_REQUIRE_PROCESS_GROUP, a success whose processes each trained alone is a failure (``outcome``)."""
        found = diagnosis.findings(self.workdir, outcome, gpus, self.env)
        if self.reason:
            found["reason"] = self.reason
        return found
