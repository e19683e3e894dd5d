"""CLI start-up cost, as ratios against a bare interpreter measured in the same run.

    python benchmarks/cli_startup.py [--repeat 15]

Prints the median wall time of each command and its ratio to `python -c pass`. `cloudtrain --help` should stay
close to the interpreter's own start (it imports no torch, no provider SDK, no pydantic).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def median_seconds(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    py = sys.executable
    cases = {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "cloudtrain --help": [py, "-m", "cloudtrain", "--help"],
        "cloudtrain schema": [py, "-m", "cloudtrain", "schema"],
        "python -c 'import torch' (for scale)": [py, "-c", "import torch"],
    }
    baseline = None
    for label, argv in cases.items():
        seconds = median_seconds(argv, args.repeat)
        baseline = baseline or seconds
        print(f"{label:40s} {seconds * 1000:8.1f} ms   {seconds / baseline:5.2f}x")


if __name__ == "__main__":
    main()
