"""`cloudtrain plan --provider gcp` without credentials: wall time, against baselines measured in the same run.

    python benchmarks/plan_gcp.py [--repeat 7]

Target: under 1 s on a laptop. Baselines: a bare interpreter, the same plan for the local provider, and what
importing the Vertex SDK's types alone costs (google.cloud.aiplatform_v1), which planning avoids by checking the
request against a snapshot of those types (cloudtrain/providers/gcp/custom_job_schema.json).
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
        # no credentials and no gcloud config anywhere: the plan must not need them
        os.environ.update(CLOUDTRAIN_GCP_PROJECT="my-project", CLOUDTRAIN_GCP_BUCKET="my-bucket",
                          CLOUDTRAIN_GCP_REGION="us-central1", CLOUDSDK_CONFIG=str(Path(tmp) / "none"),
                          NO_GCE_CHECK="true")
        os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        plan = ["plan", script, "--nodes", "4", "--gpus", "A100:8", "--spot", "-o", "json"]
        cases = {
            "python -c pass (baseline)": [py, "-c", "pass"],
            "cloudtrain plan --provider local": [py, "-m", "cloudtrain", *plan, "--provider", "local"],
            "cloudtrain plan --provider gcp": [py, "-m", "cloudtrain", *plan, "--provider", "gcp"],
            "import google.cloud.aiplatform_v1 alone": [py, "-c", "import google.cloud.aiplatform_v1"],
        }
        baseline = None
        for label, argv in cases.items():
            subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True)  # it works, before it is timed
            seconds = median_seconds(argv, args.repeat)
            baseline = baseline or seconds
            print(f"{label:40s} {seconds * 1000:8.1f} ms   {seconds / baseline:5.2f}x")


if __name__ == "__main__":
    main()
