"""The hang watchdog (``max_idle``): a node whose workers print nothing and write no checkpoint for that long is
stopped, and says so. It runs in the bootstrap, so it works on every provider where cloudtrain's bootstrap runs.

Activity is read from files, never from the workers themselves: the worker logs torchrun writes (every line a
worker prints) and the local checkpoint folder (a plain script's or the Checkpointer's saves). Only the node of
global rank 0 watches (``NodeWatch.torchrun_started``): many scripts print from rank 0 alone, so the other nodes'
silence means nothing. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cloudtrain import contract
from cloudtrain.durations import format_duration

ENV = contract.MAX_IDLE  # seconds; set by the plan when the spec has max_idle


def newest_change(folders: Iterable[Path]) -> float:
    """The newest modification time of any file or folder under ``folders`` (0 if none exists)."""
    newest = 0.0
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            for name in (*dirs, *files, ""):
                try:
                    newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
                except OSError:  # removed meanwhile (retention, a rotating log)
                    continue
    return newest


def idle_limit(env: dict[str, str]) -> float | None:
    raw = env.get(ENV, "")
    try:
        limit = float(raw)
    except ValueError:
        return None
    return limit if limit > 0 else None


def idle_reason(limit: float) -> str:
    return (f"no output and no checkpoint for {format_duration(limit)} (max_idle): stopped as hung; look at the "
            "last lines of its log for where it stopped")


def start(folders: list[Path], limit: float, on_idle: Callable[[str], None]) -> threading.Event:
    """Watch ``folders`` from now on; call ``on_idle(reason)`` once if nothing changes for ``limit`` seconds.
    Returns an event that ends the watch when set."""
    done = threading.Event()
    poll = min(max(limit / 20, 0.5), 10.0)
    started = time.time()

    def watch() -> None:
        while not done.wait(poll):
            if time.time() - max(started, newest_change(folders)) >= limit:
                on_idle(idle_reason(limit))
                return

    threading.Thread(target=watch, name="cloudtrain-watchdog", daemon=True).start()
    return done
