"""`cloudtrain plan --provider azure` without credentials: wall time of the whole process, against baselines measured
in the same run.

    python benchmarks/plan_azure.py [--repeat 9]

Target: <= 0.7 s on the project's 2-core machine (issue 19). Baselines: a bare interpreter, the same plan for the
local provider, and the old path: the same plan that also loads the job with azure-ai-ml's own ``load_job`` and builds
its request (what `plan` did before it checked the job against the schema snapshot). The cases run interleaved,
one of each per round, so a burst of load on a shared machine hits all of them alike; each line shows the median,
the spread (min-max) and the ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import REPO
from installed import compile_bytecode

# The old path, for comparison: the offline check plus the SDK's load_job and request, as `plan` did before.
OLD_PATH = ("import os, sys\n"
            "from cloudtrain.providers.azure import provider, schema\n"
            "check = schema.check_job\n"
            "def check_and_load(job, fields):\n"
            "    check(job, fields)\n"
            "    entity = provider.load_validated(job, os.environ['PLAN_AZURE_CODE'])\n"
            "    entity._to_job()._to_rest_object()\n"
            "schema.check_job = check_and_load\n"
            "from cloudtrain.cli.main import main; sys.exit(main(sys.argv[1:]))")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "entrypoints" / "train_ddp.py", Path(tmp) / "train_ddp.py")
        script = str(Path(tmp) / "train_ddp.py")
        # no credentials, no Azure CLI login, no config.json: the plan must not need them
        os.environ.update(AZURE_CONFIG_DIR=str(Path(tmp) / "az"), PLAN_AZURE_CODE=tmp,
                          CLOUDTRAIN_HOME=str(Path(tmp) / "home"))
        for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"):
            os.environ.pop(key, None)
        plan = ["plan", script, "--nodes", "4", "--gpus", "A100:8", "--spot", "-o", "json"]
        cases = {
            "python -c pass (baseline)": [py, "-c", "pass"],
            "cloudtrain plan --provider local": [py, "-m", "cloudtrain", *plan, "--provider", "local"],
            "cloudtrain plan --provider azure": [py, "-m", "cloudtrain", *plan, "--provider", "azure"],
            "old path: + azure-ai-ml load_job": [py, "-c", OLD_PATH, *plan, "--provider", "azure"],
        }
        times: dict[str, list[float]] = {label: [] for label in cases}
        for argv in cases.values():
            subprocess.run(argv, cwd=tmp, stdout=subprocess.DEVNULL, check=True)  # it works, before it is timed
        for _ in range(args.repeat):
            for label, argv in cases.items():
                start = time.perf_counter()
                subprocess.run(argv, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                times[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(found) for label, found in times.items()}
    base, local = medians["python -c pass (baseline)"], medians["cloudtrain plan --provider local"]
    print(f"{'':36s} {'median':>9s} {'min-max':>15s} {'x pass':>7s} {'x local':>8s}")
    for label, found in times.items():
        print(f"{label:36s} {medians[label] * 1000:7.0f} ms {min(found) * 1000:6.0f}-{max(found) * 1000:<6.0f}ms "
              f"{medians[label] / base:6.2f}x {medians[label] / local:7.2f}x")
    azure, old = medians["cloudtrain plan --provider azure"], medians["old path: + azure-ai-ml load_job"]
    print(f"azure plan: {azure:.2f} s (target <= 0.70 s), {old / azure:.1f}x faster than the old path")


if __name__ == "__main__":
    main()
