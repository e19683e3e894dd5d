"""One tiny real SageMaker job (about 10 minutes, a few cents on ml.m5.large). Run it with `nox -s live -- aws`.

Needs: AWS credentials (any of the usual chain), AWS_REGION, CLOUDTRAIN_AWS_ROLE (a SageMaker execution role that
can read and write CLOUDTRAIN_AWS_BUCKET) and CLOUDTRAIN_AWS_BUCKET. Optional: CLOUDTRAIN_LIVE_AWS_INSTANCE,
CLOUDTRAIN_LIVE_NODES (default 1; 2 checks multi-node rendezvous too).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.job_types import JobState
from cloudtrain.sdk import Job
from tests.conftest import REPO

pytestmark = pytest.mark.live


def _ready() -> str | None:
    missing = [k for k in ("CLOUDTRAIN_AWS_ROLE", "CLOUDTRAIN_AWS_BUCKET") if not os.environ.get(k)]
    if missing:
        return f"set {', '.join(missing)}"
    import boto3

    if boto3.session.Session().get_credentials() is None:
        return "no AWS credentials (aws configure / aws sso login)"
    return None


def test_tiny_job_trains_checkpoints_and_succeeds_on_sagemaker(tmp_path: Path) -> None:
    reason = _ready()
    if reason:
        pytest.skip(f"live AWS test: {reason}")
    shutil.copy(REPO / "entrypoints" / "train_ddp.py", tmp_path / "train_ddp.py")
    ckpt = f"s3://{os.environ['CLOUDTRAIN_AWS_BUCKET']}/cloudtrain-live/{uuid.uuid4().hex[:8]}"
    job = Job(script="train_ddp.py", source_dir=str(tmp_path), name="cloudtrain-live",
              nodes=int(os.environ.get("CLOUDTRAIN_LIVE_NODES", "1")), procs_per_node=2, max_runtime="30m",
              providers={"aws": {"instance_type": os.environ.get("CLOUDTRAIN_LIVE_AWS_INSTANCE", "ml.m5.large")}},
              checkpoint={"uri": ckpt}, args=["--epochs", "1", "--checkpoint-every", "8"])
    run = job.submit("aws")
    print(f"submitted {run.handle}")
    status = run.wait(timeout=3600, poll=30)
    logs = list(run.logs())
    assert status.state is JobState.SUCCEEDED, status.message + "\n" + "\n".join(logs[-60:])
    assert any("published" in line for line in logs)
    assert checkpoint_store.list_complete(ckpt), f"no complete checkpoint under {ckpt}"
