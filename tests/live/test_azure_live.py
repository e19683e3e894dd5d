"""One tiny real Azure ML job (serverless CPU, about 10 minutes). Run it with `nox -s live -- azure`.

Needs: `az login` (or any DefaultAzureCredential source) and a workspace: CLOUDTRAIN_LIVE_AZURE_SUBSCRIPTION,
CLOUDTRAIN_LIVE_AZURE_RESOURCE_GROUP, CLOUDTRAIN_LIVE_AZURE_WORKSPACE. Optional: CLOUDTRAIN_LIVE_AZURE_COMPUTE (a
cluster name; default: serverless), CLOUDTRAIN_LIVE_AZURE_CHECKPOINT_URI (an abfss:// URI the job's identity can
write; default: no checkpoints).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cloudtrain.job_types import JobState
from cloudtrain.sdk import Job
from tests.conftest import REPO

pytestmark = pytest.mark.live
NEEDED = ("CLOUDTRAIN_LIVE_AZURE_SUBSCRIPTION", "CLOUDTRAIN_LIVE_AZURE_RESOURCE_GROUP",
          "CLOUDTRAIN_LIVE_AZURE_WORKSPACE")


def test_tiny_job_succeeds_on_azure_ml(tmp_path: Path) -> None:
    missing = [k for k in NEEDED if not os.environ.get(k)]
    if missing:
        pytest.skip(f"live Azure test: set {', '.join(missing)}")
    shutil.copy(REPO / "entrypoints" / "train_ddp.py", tmp_path / "train_ddp.py")
    options = {"subscription_id": os.environ[NEEDED[0]], "resource_group": os.environ[NEEDED[1]],
               "workspace": os.environ[NEEDED[2]], "compute": os.environ.get("CLOUDTRAIN_LIVE_AZURE_COMPUTE")}
    ckpt = os.environ.get("CLOUDTRAIN_LIVE_AZURE_CHECKPOINT_URI")
    job = Job(script="train_ddp.py", source_dir=str(tmp_path), name="cloudtrain-live", procs_per_node=2,
              max_runtime="30m", providers={"azure": options}, checkpoint={"uri": ckpt} if ckpt else {},
              args=["--epochs", "1", "--checkpoint-every", "8"])
    run = job.submit("azure")
    print(f"submitted {run.handle}")
    status = run.wait(timeout=3600, poll=30, recover=True)
    logs = list(run.logs())
    assert status.state is JobState.SUCCEEDED, status.message + "\n" + "\n".join(logs[-60:])
    assert any("node 0/1 on azureml" in line for line in logs)
