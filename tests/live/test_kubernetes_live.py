"""One tiny real TrainJob on your own cluster (kind, k3s, GKE, EKS, AKS). Run it with `nox -s live -- kubernetes`.

Needs: a kubeconfig whose context reaches the cluster (CLOUDTRAIN_KUBERNETES_CONTEXT, else the current one);
Kubeflow Trainer v2.3 installed with its runtimes (`kubectl apply --server-side -k
"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"` and `.../overlays/runtimes?ref=v2.3.0`);
a namespace (CLOUDTRAIN_KUBERNETES_NAMESPACE, default: the context's) with a ReadWriteMany claim named by
CLOUDTRAIN_LIVE_KUBERNETES_STAGING (e.g. pvc://shared/cloudtrain; kind's default storage class is ReadWriteOnce, which
works for a one-node cluster) or an s3://, gs://, az:// staging the nodes' service account can read. CPU nodes do:
the job runs 2 nodes x 1 process with gloo (CLOUDTRAIN_LIVE_NODES to change).
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


def test_tiny_trainjob_runs_on_a_real_cluster(tmp_path: Path) -> None:
    staging = os.environ.get("CLOUDTRAIN_LIVE_KUBERNETES_STAGING")
    if not staging:
        pytest.skip("live Kubernetes test: set CLOUDTRAIN_LIVE_KUBERNETES_STAGING (pvc://CLAIM/path or s3://...)")
    shutil.copy(REPO / "entrypoints" / "plain_torchrun.py", tmp_path / "plain_torchrun.py")
    nodes = int(os.environ.get("CLOUDTRAIN_LIVE_NODES", "2"))
    job = Job(script="plain_torchrun.py", source_dir=str(tmp_path), name="cloudtrain-live", nodes=nodes,
              procs_per_node=1, max_runtime="20m", providers={"kubernetes": {"staging": staging}})
    run = job.submit("kubernetes")
    status = run.wait(timeout=1200, poll=5, progress=False)
    logs = "\n".join(run.logs())
    assert status.state is JobState.SUCCEEDED, logs[-3000:]
    assert f"all_reduce ok: True world_size={nodes}" in logs
