"""CLI start-up cost, as ratios against a bare interpreter measured in the same run.

    python benchmarks/cli_startup.py [--repeat 15]

Prints the median wall time of each command (min-max), its ratio to `python -c pass` and the difference from it.
`cloudtrain --help` should stay within 0.05 s of the interpreter's own start (it imports no torch, no provider
SDK, no pydantic); `cloudtrain plan --provider local` packages a small folder and derives each node's torchrun line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from installed import compile_bytecode

REPO = Path(__file__).resolve().parents[1]


def timings(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return times


def median_seconds(argv: list[str], repeat: int) -> float:
    """The median wall time of ``repeat`` runs of a whole command (plan_aws.py and plan_gcp.py use it too)."""
    return statistics.median(timings(argv, repeat))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    py = sys.executable
    trainer = str(REPO / "entrypoints" / "train_ddp.py")
    cases = {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "cloudtrain --help": [py, "-m", "cloudtrain", "--help"],
        "cloudtrain catalog": [py, "-m", "cloudtrain", "catalog"],
        "cloudtrain doctor": [py, "-m", "cloudtrain", "doctor"],
        "cloudtrain schema": [py, "-m", "cloudtrain", "schema"],
        # what status, logs and wait load too (a loop that polls a job pays it each time): no spec, no pydantic
        "cloudtrain list --provider local": [py, "-m", "cloudtrain", "list", "--provider", "local"],
        "cloudtrain plan --provider local": [py, "-m", "cloudtrain", "plan", trainer, "--provider", "local",
                                             "--nodes", "2", "--procs-per-node", "2"],
        "python -c 'import torch' (for scale)": [py, "-c", "import torch"],
    }
    baseline = None
    for label, argv in cases.items():
        times = timings(argv, args.repeat)
        seconds = statistics.median(times)
        baseline = baseline or seconds
        extra = (seconds - baseline) * 1000
        print(f"{label:40s} {seconds * 1000:8.1f} ms ({min(times) * 1000:.0f}-{max(times) * 1000:.0f})   "
              f"{seconds / baseline:5.2f}x   +{extra:6.1f} ms")
    print("target: cloudtrain --help within 50 ms of the baseline")


if __name__ == "__main__":
    main()
