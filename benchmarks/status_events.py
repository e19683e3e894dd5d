"""`cloudtrain status` of a job whose timeline holds 10,000 events (issue 41: it stays under 0.15 s here).

    python benchmarks/status_events.py [--events 10000] [--repeat 9]

Runs one real local job (a script that exits at once) in a fresh home, appends ``--events`` node events (steps and
checkpoints, as the reference trainers print them) to its node log, then times `status`, `status -o json` and
`status -o openmetrics` against `python -c pass` in the same run: medians, and their ratios to the baseline. A
benchmark, never a timing assert in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed import compile_bytecode

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    compile_bytecode()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "CLOUDTRAIN_HOME": str(root / "home"), "CLOUDTRAIN_CONFIG": str(root / "none.yaml"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        (root / "proj").mkdir()
        (root / "proj" / "quick.py").write_text("print('done')\n")
        out = subprocess.run([py, "-m", "cloudtrain", "submit", str(root / "proj" / "quick.py")], env=env,
                             capture_output=True, text=True, cwd=root, check=True)
        handle = next(w for w in (out.stdout + out.stderr).split() if w.startswith("local://"))
        log = next((root / "home" / "jobs").glob("*/node-0.log"))
        start = time.time() - args.events
        with open(log, "a", encoding="utf-8") as f:
            for i in range(args.events):
                event = {"e": "checkpoint", "t": start + i, "step": i * 10, "bytes": 1 << 20, "blocked_s": 0.01,
                         "publish_s": 0.2} if i % 10 == 9 else {"e": "step", "t": start + i, "step": i * 10,
                                                                 "total": args.events * 10}
                f.write("[default0]:cloudtrain-event " + json.dumps(event, separators=(",", ":")) + "\n")
        baseline = timed([py, "-c", "pass"], env, args.repeat)
        print(f"{'python -c pass':36s} {baseline * 1000:7.1f} ms")
        for label, extra in (("status", []), ("status -o json", ["-o", "json"]),
                             ("status -o openmetrics", ["-o", "openmetrics"])):
            seconds = timed([py, "-m", "cloudtrain", "status", handle, *extra], env, args.repeat)
            print(f"{label + f' ({args.events} events)':36s} {seconds * 1000:7.1f} ms   {seconds / baseline:5.2f}x"
                  f"   {'within' if seconds < 0.15 else 'OVER'} 0.15 s")


if __name__ == "__main__":
    main()
