"""CLI start-up cost, as ratios against a bare interpreter measured in the same run.

    python benchmarks/cli_startup.py [--repeat 15]

Prints the median wall time of each command (min-max), its ratio to `python -c pass` and the difference from it.
`--only TEXT` times the commands whose label holds TEXT (and the baseline). The plan-time guard: the run exits 1
where `cloudtrain plan --provider local` takes more than --max-plan-ratio times the baseline (default 25; it was
15.6x, 211 ms against 13.5 ms, on the 2-core dev machine in November 2026; 0: print the ratio only). A ratio measured
in one run, so a loaded machine slows both sides; a benchmark, never a timing assert in the tests.
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
    parser.add_argument("--only", default="", help="time only the commands whose label holds this text")
    parser.add_argument("--max-plan-ratio", type=float, default=25.0,
                        help="exit 1 where the local plan takes more than this many times the baseline (0: no bound)")
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
    ratios = {}
    for label, argv in cases.items():
        if args.only not in label and baseline is not None:
            continue
        times = timings(argv, args.repeat)
        seconds = statistics.median(times)
        baseline = baseline or seconds
        extra = (seconds - baseline) * 1000
        ratios[label] = seconds / baseline
        print(f"{label:40s} {seconds * 1000:8.1f} ms ({min(times) * 1000:.0f}-{max(times) * 1000:.0f})   "
              f"{seconds / baseline:5.2f}x   +{extra:6.1f} ms")
    print("target: cloudtrain --help within 50 ms of the baseline")
    plan = ratios.get("cloudtrain plan --provider local")
    if plan is not None:
        bound = args.max_plan_ratio
        verdict = "" if not bound else f": {'within' if plan <= bound else 'OVER'} the bound of {bound:g}x"
        print(f"plan ratio {plan:.2f}x{verdict}")
        if bound and plan > bound:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
