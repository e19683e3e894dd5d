"""`cloudtrain plan --provider kubernetes` offline (no cluster, no kubeconfig): wall time, against baselines
measured in the same run.

    python benchmarks/plan_kubernetes.py [--repeat 7]

Target: 0.3 s on a quiet laptop, and a small ratio to `plan -p local` (the plan checks the TrainJob against the
vendored CRD schema with jsonschema; the official kubernetes client is never imported by a plan, which its own row
shows the cost of).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import REPO, median_seconds
from installed import compile_bytecode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "entrypoints" / "train_ddp.py", Path(tmp) / "train_ddp.py")
        script = str(Path(tmp) / "train_ddp.py")
        os.environ.update(KUBECONFIG=str(Path(tmp) / "none"), CLOUDTRAIN_KUBERNETES_STAGING="s3://bucket/ct")
        plan = ["plan", script, "--nodes", "4", "--gpus", "A100:8", "-o", "json"]
        cases = {
            "python -c pass (baseline)": [py, "-c", "pass"],
            "cloudtrain plan --provider local": [py, "-m", "cloudtrain", *plan, "--provider", "local"],
            "cloudtrain plan --provider kubernetes": [py, "-m", "cloudtrain", *plan, "--provider", "kubernetes"],
            "import kubernetes.client alone": [py, "-c", "import kubernetes.client"],
        }
        times = {}
        for label, argv in cases.items():
            subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True)  # it works, before it is timed
            times[label] = median_seconds(argv, args.repeat)
        base = times["python -c pass (baseline)"]
        for label, seconds in times.items():
            print(f"{label:42s} {seconds * 1000:8.1f} ms   {seconds / base:5.2f}x")
        ratio = times["cloudtrain plan --provider kubernetes"] / times["cloudtrain plan --provider local"]
        print(f"plan kubernetes / plan local: {ratio:.2f}")


if __name__ == "__main__":
    main()
