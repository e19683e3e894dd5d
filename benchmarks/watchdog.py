"""The hang watchdog's signals and what a poll costs (issue 29.3).

    python benchmarks/watchdog.py [--procs 2] [--seconds 12] [--span 2] [--repeat 200]

Three real ``torchrun`` jobs (gloo, CPU) are started under this process, as the bootstrap starts them, and the
watchdog's CPU signal (``process_tree.cpu_below``: each worker's CPU time from /proc) is sampled every ``--span``
seconds, as ``idle_watchdog.CpuActivity`` samples it:

    deadlock   rank 0 in all_reduce, rank 1 never joins (process-group timeout: a day)  -> must read idle
    sleeping   every rank in time.sleep after init (tests/scripts/hangs.py)           -> must read idle
    computing  every rank multiplies matrices, printing nothing                       -> must read busy

For each it prints the busiest worker's share of one core per window (max and median) and what ``idle_watchdog.busy``
says, then the margin: the smallest computing share over the largest deadlocked one (in the same run).

The cost of a poll is timed against the poll the watchdog already made before the CPU signal (``newest_change`` over
the worker logs and a checkpoint folder of 3 checkpoints x 10 files), while the computing job runs: the ratio is
CPU poll / file poll, and the overhead is a poll's time over the default 30m limit's poll interval (10 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloudtrain.node import idle_watchdog, process_tree  # noqa: E402

SCRIPTS = {
    "deadlock": REPO / "tests" / "scripts" / "deadlocks.py",
    "sleeping": REPO / "tests" / "scripts" / "hangs.py",
    "computing": REPO / "tests" / "scripts" / "silent_busy.py",
}


def start(name: str, procs: int, seconds: float, logs: Path) -> subprocess.Popen[bytes]:
    args = ["600"] if name == "computing" else []
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
         "--log-dir", str(logs / name), "--redirects", "3", str(SCRIPTS[name]), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def shares(seconds: float, span: float, logs: Path, procs: int) -> list[float]:
    """The busiest worker's share of one core in each ``span`` window, once every rank said it started (imports and
    init_process_group are busy by nature)."""
    deadline = time.monotonic() + 300
    while sum("started rank=" in f.read_text() for f in logs.rglob("stdout.log")) < procs:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    found, end = [], time.monotonic() + seconds
    before, at = process_tree.cpu_below(os.getpid()), time.monotonic()
    while time.monotonic() < end:
        time.sleep(span)
        after, now = process_tree.cpu_below(os.getpid()), time.monotonic()
        found.append(max((cpu - before.get(pid, 0.0) for pid, cpu in after.items()), default=0.0) / (now - at))
        before, at = after, now
    return found


def timed(call, repeat: int) -> float:  # type: ignore[no-untyped-def]
    began = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - began) / repeat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seconds", type=float, default=12.0, help="how long each job is watched")
    p.add_argument("--span", type=float, default=2.0, help="CPU sample window (the watchdog's: limit/4, <= 10 s)")
    p.add_argument("--repeat", type=int, default=200, help="polls timed for the cost")
    args = p.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        logs, ckpt = Path(tmp) / "worker-logs", Path(tmp) / "checkpoints"
        for n in range(3):
            (ckpt / f"step-{n:09d}").mkdir(parents=True)
            for f in range(10):
                (ckpt / f"step-{n:09d}" / f"__{f}_0.distcp").write_bytes(b"x" * 1024)
        for name in SCRIPTS:
            job = start(name, args.procs, args.seconds, logs)
            try:
                results[name] = found = shares(args.seconds, args.span, logs / name, args.procs)
                if name == "computing":  # the poll's cost, with real workers to find
                    files = timed(lambda: idle_watchdog.newest_change([logs, ckpt]), args.repeat)
                    cpu = timed(lambda: process_tree.cpu_below(os.getpid()), args.repeat)
                    watched = len(process_tree.cpu_below(os.getpid()))
            finally:
                os.killpg(job.pid, 9)
                job.wait()
            busy = [s >= idle_watchdog.BUSY_SHARE for s in found]
            print(f"{name:<10} busiest worker's share of a core per {args.span:g}s window: max {max(found):.3f}, "
                  f"median {statistics.median(found):.3f}; busy in {sum(busy)}/{len(busy)} windows "
                  f"(threshold {idle_watchdog.BUSY_SHARE})", flush=True)
    idle_max = max(max(results["deadlock"]), max(results["sleeping"]))
    margin = min(results["computing"]) / max(idle_max, 1e-3)
    print(f"poll: files {files * 1e3:.2f} ms, files + CPU {(files + cpu) * 1e3:.2f} ms "
          f"({watched} worker processes); overhead at the default 10 s poll: "
          f"{(files + cpu) / 10 * 100:.3f}% of one core")
    print(f"ratios: poll with CPU / without {(files + cpu) / files:.2f}x; computing share / deadlocked share "
          f"{margin:.1f}x (min over max); threshold / deadlocked share "
          f"{idle_watchdog.BUSY_SHARE / max(idle_max, 1e-3):.1f}x")


if __name__ == "__main__":
    main()
