"""The hang watchdog (``max_idle``, on by default): a node whose workers print nothing, write no checkpoint and use
no CPU for that long is stopped, and says so. It runs in the bootstrap, so it works on every provider where
cloudtrain's bootstrap runs.

Activity is read from outside the workers, never from inside them: the worker logs torchrun writes (every line a
worker prints), the local checkpoint folder (a plain script's or the Checkpointer's saves), and the CPU time of the
worker processes in /proc (a script that computes silently for hours is busy, not hung). The last one is how the
watchdog sees a process group's collectives on CPU: gloo waits for a peer in epoll and condition variables, so a
rank stuck in ``all_reduce`` uses next to no CPU (measured: ~0.3% of a core), while any computing rank uses a large
share of one. torch's own hang tools (``TORCH_NCCL_ENABLE_MONITORING``, the flight recorder) are NCCL-only and
gloo has no hook. ``benchmarks/watchdog.py`` measures both signals and the cost of a poll.

Only the node of global rank 0 watches (``NodeWatch.torchrun_started``): many scripts print from rank 0 alone, so
the other nodes' silence means nothing. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cloudtrain import contract
from cloudtrain.node import process_tree
from cloudtrain.node.durations import format_duration

ENV = contract.MAX_IDLE  # seconds; set by the plan unless the spec says max_idle: off
# A worker process is busy when it used this share of one core since the previous CPU sample. A rank waiting in a
# gloo collective uses ~0.3%, a computing one tens of percent even on a crowded machine (benchmarks/watchdog.py).
BUSY_SHARE = 0.05


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


def busy(before: dict[int, float], after: dict[int, float], seconds: float) -> bool:
    """Whether any process of ``after`` (pid -> CPU seconds) used ``BUSY_SHARE`` of a core over ``seconds`` since
    ``before`` (a process new since then counts from zero: it started, which is activity too)."""
    return any(used - before.get(pid, 0.0) >= BUSY_SHARE * seconds for pid, used in after.items())


class CpuActivity:
    """When the processes below ``root`` last used CPU; sampled at most every ``span`` seconds, so that a clock tick
    (10 ms) never decides alone.

    Until the first worker exists, torchrun is starting or waiting in its rendezvous for the other nodes (a peer
    node that is slow to start, on a crowded machine, can take longer than ``max_idle``): that wait is bounded by
    the rendezvous' own timeout, so it counts as activity, and the idle clock starts with the workers."""

    def __init__(self, root: int, span: float) -> None:
        self.root, self.span = root, span
        self.at, self.sample = time.time(), process_tree.cpu_below(root)
        self.last_busy = 0.0
        self.before_workers = process_tree.observable() and not self.sample

    def poll(self) -> float:
        now = time.time()
        if self.before_workers:
            self.at, self.sample = now, process_tree.cpu_below(self.root)
            self.before_workers = not self.sample
            self.last_busy = now  # a worker's start is activity too
        elif now - self.at >= self.span:
            sample = process_tree.cpu_below(self.root)
            if busy(self.sample, sample, now - self.at):
                self.last_busy = now
            self.at, self.sample = now, sample
        return self.last_busy


def idle_limit(env: dict[str, str]) -> float | None:
    raw = env.get(ENV, "")
    try:
        limit = float(raw)
    except ValueError:
        return None
    return limit if limit > 0 else None


def idle_reason(limit: float) -> str:
    return (f"no output, no checkpoint and no CPU use for {format_duration(limit)} (max_idle): stopped as hung; look "
            "at the last lines of its log for where it stopped (max_idle: off turns the watchdog off)")


def start(folders: list[Path], limit: float, on_idle: Callable[[str], None],
          root: int | None = None) -> threading.Event:
    """Watch ``folders`` and the CPU time of the processes below ``root``'s children (default: this process's) from
    now on; call ``on_idle(reason)`` once if none of them changes for ``limit`` seconds. Returns an event that ends
    the watch when set."""
    done = threading.Event()
    poll = min(max(limit / 20, 0.5), 10.0)
    started = time.time()
    cpu = CpuActivity(os.getpid() if root is None else root, span=min(max(limit / 4, poll), 10.0))

    def watch() -> None:
        while not done.wait(poll):
            if time.time() - max(started, cpu.poll(), newest_change(folders)) >= limit:
                on_idle(idle_reason(limit))
                return

    threading.Thread(target=watch, name="cloudtrain-watchdog", daemon=True).start()
    return done
