"""One tiny real Vertex AI custom job (about 10-15 minutes, a few cents on n1-standard-4). Run it with
`nox -s live -- gcp`.

Needs: Application Default Credentials (`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS),
CLOUDTRAIN_GCP_PROJECT (the Vertex AI API enabled), CLOUDTRAIN_GCP_BUCKET (a bucket in that project the job's
service account can read and write), and optionally CLOUDTRAIN_GCP_REGION (default us-central1),
CLOUDTRAIN_LIVE_GCP_MACHINE (default n1-standard-4), CLOUDTRAIN_LIVE_NODES (default 1; 2 checks the two worker
pools and multi-node rendezvous too).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.job_types import JobState
from cloudtrain.providers.gcp.provider import VertexProvider
from cloudtrain.sdk import Job, Run, plan_job
from tests.conftest import REPO

pytestmark = pytest.mark.live


def _ready() -> str | None:
    missing = [k for k in ("CLOUDTRAIN_GCP_PROJECT", "CLOUDTRAIN_GCP_BUCKET") if not os.environ.get(k)]
    if missing:
        return f"set {', '.join(missing)}"
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        return "no Google credentials (gcloud auth application-default login)"
    return None


def test_tiny_job_trains_checkpoints_and_succeeds_on_vertex(tmp_path: Path) -> None:
    reason = _ready()
    if reason:
        pytest.skip(f"live GCP test: {reason}")
    shutil.copy(REPO / "entrypoints" / "train_ddp.py", tmp_path / "train_ddp.py")
    ckpt = f"gs://{os.environ['CLOUDTRAIN_GCP_BUCKET']}/cloudtrain-live/{uuid.uuid4().hex[:8]}"
    job = Job(script="train_ddp.py", source_dir=str(tmp_path), name="cloudtrain-live",
              nodes=int(os.environ.get("CLOUDTRAIN_LIVE_NODES", "1")), procs_per_node=2, max_runtime="30m",
              providers={"gcp": {"machine_type": os.environ.get("CLOUDTRAIN_LIVE_GCP_MACHINE", "n1-standard-4")}},
              checkpoint={"uri": ckpt}, args=["--epochs", "1", "--checkpoint-every", "8"])
    provider = VertexProvider()  # constructed directly: works whether or not the registry names it yet
    with plan_job(job.spec, provider) as plan:
        run = Run(provider.submit(plan), provider)
    print(f"submitted {run.handle}")
    status = run.wait(timeout=3600, poll=30)
    logs = list(run.logs())
    assert status.state is JobState.SUCCEEDED, status.message + "\n" + "\n".join(logs[-60:])
    assert any("published" in line for line in logs)
    assert checkpoint_store.list_complete(ckpt), f"no complete checkpoint under {ckpt}"
    assert any(s.handle == run.handle for s in provider.list(50))
