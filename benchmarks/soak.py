"""Preemption soak, full form: the FSDP job (2 nodes x 2 processes) interrupted N times at random (SIGTERM and
SIGKILL; at startup, between steps, during saves, during uploads) against the same job run uninterrupted in the
same run.

    python benchmarks/soak.py [--interruptions 20] [--seed 1] [--keep-files]

Prints the figures (interruptions by kind and moment, restarts, resubmissions, steps re-done, checkpoints lost,
wall time vs the uninterrupted run) and exits 1 if any check failed: final weights not bitwise equal, an orphan
process, a checkpoint lost, or anything in the checkpoint store beyond retention.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.soak import SoakConfig, run_soak


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--interruptions", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=None, help="default: enough for every interruption")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--upload-delay", type=float, default=0.15, help="seconds each stored file stays in flight")
    p.add_argument("--keep-files", action="store_true", help="leave the runs' folders for inspection")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ct-soak-"))
    config = SoakConfig(interruptions=args.interruptions, seed=args.seed, epochs=args.epochs,
                        checkpoint_every=args.checkpoint_every, step_sleep=args.step_sleep,
                        upload_delay=args.upload_delay,
                        log=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True))
    try:
        report = run_soak(root, config)
    finally:
        if not args.keep_files:
            shutil.rmtree(root, ignore_errors=True)
    print(report.text())
    print(json.dumps(report.figures()))
    if report.problems:
        print("FAILED:\n" + "\n".join(report.problems))
        return 1
    print(f"ok: {len(report.interruptions)} interruptions, bitwise equal, no orphans, store clean "
          f"(soak {report.soak_seconds:.0f}s = {report.soak_seconds / report.baseline_seconds:.1f}x the "
          f"uninterrupted run's {report.baseline_seconds:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
