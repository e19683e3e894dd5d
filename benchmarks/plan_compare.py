"""`cloudtrain plan --compare` (every installed provider, offline) against one `plan -p local` in the same run.

    python benchmarks/plan_compare.py [--repeat 5]

The source is packaged once and each provider plans in-process; a provider imports its SDK only where its own plan
validation needs it. Reported: wall time per case (median) and its ratio to `plan -p local`, plus the compare with
two regions per cloud that has a region setting (more rows, same process).
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
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "entrypoints" / "train_ddp.py", Path(tmp) / "train_ddp.py")
        os.environ.update(CLOUDTRAIN_HOME=str(Path(tmp) / "home"), CLOUDTRAIN_CONFIG=str(Path(tmp) / "config.yaml"),
                          CLOUDTRAIN_PLUGINS="none", AWS_EC2_METADATA_DISABLED="true")
        plan = [py, "-m", "cloudtrain", "plan", str(Path(tmp) / "train_ddp.py"), "--nodes", "2", "--gpus", "A100:8",
                "--spot", "-o", "json"]
        cases = {
            "cloudtrain plan -p local (baseline)": [*plan, "-p", "local"],
            "cloudtrain plan -p gcp": [*plan, "-p", "gcp"],
            "cloudtrain plan --compare": [*plan, "--compare"],
            "plan --compare, 2 regions for aws and gcp": [*plan, "--compare", "--region", "aws=us-east-1,us-west-2",
                                                          "--region", "gcp=us-central1,europe-west4"],
        }
        baseline = None
        for label, argv in cases.items():
            subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True)  # it works, before it is timed
            seconds = median_seconds(argv, args.repeat)
            baseline = baseline or seconds
            print(f"{label:45s} {seconds * 1000:8.1f} ms   {seconds / baseline:5.2f}x")


if __name__ == "__main__":
    main()
