"""Process identity and signalling. A PID alone can be reused after a reboot; PID plus start time cannot."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cloudtrain import contract


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


# torchrun starts every worker in a session of its own, so killing a node's process group misses its workers
# once the agent is gone. Every process of a node inherits this variable; /proc finds them even after they were
# re-parented.
TAG_VAR = contract.PROCESS_TAG


def tagged_pids(tag: str) -> list[int]:
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_tagged(tag: str | None, sig: int = signal.SIGKILL) -> int:
    """Signal every live process carrying ``tag``; returns how many were signalled."""
    if not tag:
        return 0
    count = 0
    for pid in tagged_pids(tag):
        if pid == os.getpid() or _state(pid) == "Z":
            continue
        try:
            os.kill(pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            continue
    return count


def tag_alive(tag: str | None) -> bool:
    return bool(tag) and any(_state(pid) not in (None, "Z") for pid in tagged_pids(str(tag)))
