"""Nothing a job starts outlives its node (stdlib only, Python 3.8: the bootstrap loads it from the bundle's lib/).

The bootstrap makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a process the script
starts and leaves behind — a helper in a session of its own (``start_new_session=True``), a double-forked daemon,
one with a cleaned environment that no marker variable reaches — is re-parented to the bootstrap when its parent
exits, not to init. When the workers have ended (succeeded, failed or preempted), every process still below the
bootstrap is the job's leftover: it gets SIGTERM, then SIGKILL after a short grace period. Where prctl is missing
(not Linux), only the processes still descending from the bootstrap are found.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

PR_SET_CHILD_SUBREAPER = 36
GRACE = 2.0  # seconds a leftover gets between SIGTERM and SIGKILL


def become_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def observable() -> bool:
    """Whether this system shows processes in /proc (Linux; not macOS): without it, no CPU or tree is read."""
    return os.path.isdir("/proc")


def _table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, state, CPU ticks used: user + system) of every process /proc shows."""
    found = {}
    for entry in os.listdir("/proc") if observable() else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(entry)] = (int(fields[1]), fields[0], int(fields[11]) + int(fields[12]))
    return found


def _below(table: dict[int, tuple[int, str, int]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            todo.append(child)
            if table[child][1] != "Z":
                found.append(child)
    return found


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` (zombies excluded), parents before children."""
    return _below(_table(), root)


def cpu_below(root: int) -> dict[int, float]:
    """CPU seconds used so far by each live process below ``root``'s own children: under the bootstrap, the workers
    torchrun started and what they started, not torchrun's agent (whose monitor loop polls all along)."""
    table = _table()
    if not table:  # no /proc (macOS): no CPU signal
        return {}
    tick = float(os.sysconf("SC_CLK_TCK"))
    agents = {pid for pid, (ppid, _, _) in table.items() if ppid == root}
    return {pid: table[pid][2] / tick for pid in _below(table, root) if pid not in agents}


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def end_leftovers(grace: float = GRACE) -> list[str]:
    """End every process still below this one (SIGTERM, then SIGKILL after ``grace``) and reap what was ours to
    reap. Returns each as ``pid (command)``, for the node's log and status."""
    me = os.getpid()
    left = descendants(me)
    shown = [f"{pid} ({command_of(pid)})" for pid in left]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 1.0)
        while left and time.monotonic() < deadline:
            _reap(left)
            left = [pid for pid in descendants(me) if pid in left]
            if left:
                time.sleep(0.05)
        if not left:
            break
    _reap(left)
    return shown


def end_leftovers_said(log: Callable[[str], None]) -> list[str]:
    """Once the workers ended (the bootstrap): ``end_leftovers``, said in the node's log; returns that line for its
    status (none when nothing was left running)."""
    left = end_leftovers()
    if not left:
        return []
    line = f"ended {len(left)} process(es) the job left running: {', '.join(left[:3])}"
    log(line)
    return [line]


def _reap(pids: list[int]) -> None:
    for pid in pids:  # only our own children (the re-parented ones included) can be reaped
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
