"""When each node's log grew, so that `cloudtrain logs --merge` orders a local job's lines by time across its nodes
as `logs -f` interleaves them while it runs. The nodes write their logs themselves (the supervisor hands each its
file), so the lines carry no time: the supervisor notes ``<time> <rank> <size>`` in ``logs.clock`` whenever a log
has grown, at most every ``TICK`` seconds (a chatty 2-node day: a few MB)."""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

CLOCK = "logs.clock"
TICK = 0.5  # seconds: lines within one tick come node by node, as one read of `logs -f` gives them


def node_log(job_dir: Path, rank: int) -> Path:
    return job_dir / f"node-{rank}.log"


class LogClock:
    def __init__(self, job_dir: Path, ranks: Iterable[int]) -> None:
        self.path, self.job_dir = job_dir / CLOCK, job_dir
        self.sizes = dict.fromkeys(ranks, 0)
        self.last = 0.0

    def tick(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < TICK:
            return
        self.last, grown = now, []
        for rank, before in self.sizes.items():
            with contextlib.suppress(OSError):
                size = node_log(self.job_dir, rank).stat().st_size
                if size > before:
                    grown.append(f"{now:.3f} {rank} {size}\n")
                    self.sizes[rank] = size
        if grown:
            with contextlib.suppress(OSError), open(self.path, "a", encoding="ascii") as f:  # a full disk: no order
                f.write("".join(grown))


def merged(job_dir: Path, ranks: list[int]) -> Iterator[str]:
    """Every node's lines (``[nodeK] line``) ordered by when the clock first saw them; lines it never saw (a job
    from before the clock, a full disk) come last, node by node."""
    marks: dict[int, tuple[list[int], list[float]]] = {r: ([], []) for r in ranks}
    with contextlib.suppress(OSError):
        for row in (job_dir / CLOCK).read_text(encoding="ascii", errors="replace").splitlines():
            parts = row.split()
            if len(parts) == 3 and parts[1].lstrip("-").isdigit() and int(parts[1]) in marks:
                with contextlib.suppress(ValueError):
                    sizes, times = marks[int(parts[1])]
                    sizes.append(int(parts[2]))
                    times.append(float(parts[0]))
    lines: list[tuple[float, int, int, str]] = []
    for rank in ranks:
        try:
            data = node_log(job_dir, rank).read_bytes()
        except OSError:
            continue
        sizes, times = marks[rank]
        end = 0
        for n, raw in enumerate(data.splitlines(keepends=True)):
            end += len(raw)
            at = bisect.bisect_left(sizes, end)  # the first tick that saw this line whole
            when = times[at] if at < len(times) else float("inf")
            lines.append((when, rank, n, raw.decode("utf-8", errors="replace").rstrip("\n")))
    lines.sort()
    return (f"[node{rank}] {text}" for _, rank, _, text in lines)
