"""Process identity and signalling. A PID alone can be reused after a reboot; PID plus start time cannot."""

from __future__ import annotations

import os
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def is_alive(pid: int | None, ticks: int | None = None) -> bool:
    """True if ``pid`` runs and is the same process that was recorded (same start time); zombies are dead."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _state(pid) == "Z":
        return False
    current = start_ticks(pid)
    return ticks is None or current is None or current == ticks


def signal_group(pgid: int | None, sig: int) -> bool:
    """Signal a whole process group (a node: bootstrap, torchrun and its workers). False if it is gone."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int | None) -> bool:
    return signal_group(pgid, 0) if pgid else False
