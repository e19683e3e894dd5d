"""`cloudtrain plan --provider aws` without credentials: wall time, against baselines measured in the same run.

    python benchmarks/plan_aws.py [--repeat 7]

Target: under 1 s on a laptop. Baselines: a bare interpreter, the same plan for the local provider, and what the
image lookup alone would cost through the SageMaker SDK (import sagemaker.core + image_uris.retrieve), which the
provider avoids by reading the SDK's image catalogue as data.
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

SDK_LOOKUP = ("from sagemaker.core import image_uris; image_uris.retrieve('pytorch', region='us-east-1', "
              "version='2.5', py_version='py311', instance_type='ml.p4d.24xlarge', image_scope='training')")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    compile_bytecode()  # timed as installed: with bytecode (benchmarks/installed.py)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "entrypoints" / "train_ddp.py", Path(tmp) / "train_ddp.py")
        script = str(Path(tmp) / "train_ddp.py")
        # no credentials anywhere: the plan must not need them
        os.environ.update(AWS_REGION="us-east-1", AWS_SHARED_CREDENTIALS_FILE=str(Path(tmp) / "none"),
                          AWS_CONFIG_FILE=str(Path(tmp) / "none"), AWS_EC2_METADATA_DISABLED="true")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            os.environ.pop(key, None)
        plan = [py, "-m", "cloudtrain", "plan", script, "--nodes", "4", "--gpus", "A100:8", "--spot", "-o", "json"]
        cases = {
            "python -c pass (baseline)": [py, "-c", "pass"],
            "cloudtrain plan --provider local": [*plan, "--provider", "local"],
            "cloudtrain plan --provider aws": [*plan, "--provider", "aws"],
            "SageMaker SDK image lookup alone": [py, "-c", SDK_LOOKUP],
        }
        baseline = None
        for label, argv in cases.items():
            subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True)  # it works, before it is timed
            seconds = median_seconds(argv, args.repeat)
            baseline = baseline or seconds
            print(f"{label:40s} {seconds * 1000:8.1f} ms   {seconds / baseline:5.2f}x")


if __name__ == "__main__":
    main()
