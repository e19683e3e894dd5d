"""A job never restores another job's checkpoint by accident: default locations are named by the job's lineage
(name, entry point, project folder), every manifest records it, and restore refuses another lineage's checkpoints;
a file:// location in a cloud plan is never sent to the nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.bundle.staging import lineage_id
from cloudtrain.cli.render import plan_text
from cloudtrain.sdk import Job
from tests.conftest import REPO

CLOUD = {"AWS_REGION": "eu-west-1", "CLOUDTRAIN_AWS_ROLE": "arn:aws:iam::123456789012:role/r",
         "CLOUDTRAIN_AWS_BUCKET": "bkt", "CLOUDTRAIN_GCP_PROJECT": "p", "CLOUDTRAIN_GCP_BUCKET": "bkt"}


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CLOUD.items():
        monkeypatch.setenv(key, value)


def project(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    return folder


def checkpoint_uri(folder: Path, cloud: str, *args: str) -> str:
    with Job(script="train.py", source_dir=str(folder), spot=True, args=list(args)).plan(cloud) as plan:
        return str(plan.spec.checkpoint.uri)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_two_projects_train_py_never_share_a_default_checkpoint_location(clouds: None, tmp_path: Path,
                                                                          cloud: str) -> None:
    """Issue 16: every unrelated train.py in the same bucket got <bucket>/cloudtrain/checkpoints/train."""
    first, second = project(tmp_path, "vision"), project(tmp_path, "speech")
    assert checkpoint_uri(first, cloud) != checkpoint_uri(second, cloud)
    # the same job submitted again, with other arguments, resumes from the same place
    assert checkpoint_uri(first, cloud, "--epochs", "5") == checkpoint_uri(first, cloud)
    assert checkpoint_uri(first, cloud).endswith("/checkpoints/" + lineage_id(Job(script="train.py",
                                                                                  source_dir=str(first)).spec))


def test_the_plan_says_where_it_resumes_from_and_why(clouds: None, tmp_path: Path) -> None:
    with Job(script="train.py", source_dir=str(project(tmp_path, "p")), spot=True).plan("aws") as plan:
        lineage = plan.request["Environment"]["CLOUDTRAIN_LINEAGE"]
        assert any(f"resumes from the newest checkpoint under {plan.spec.checkpoint.uri}" in n and lineage in n
                   for n in plan.notes)


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_local_checkpoint_uri_is_never_sent_to_cloud_nodes(clouds: None, tmp_path: Path, cloud: str) -> None:
    local = (tmp_path / "ck").as_uri()
    with Job(script="train.py", source_dir=str(project(tmp_path, "p")),
             checkpoint={"uri": local}).plan(cloud) as plan:
        sent = json.dumps(plan.request)
        assert local not in sent
        assert any("CHECKPOINT MOVED" in n or "CHECKPOINTS OFF" in n for n in plan.notes)
        # the summary a user reads says what is sent (Azure once showed the file:// URI beside "CHECKPOINTS OFF")
        assert plan.spec.checkpoint.uri is None or not plan.spec.checkpoint.uri.startswith("file://")
        assert f"checkpoint   {local}" not in plan_text(plan)


def run_module(*args: str, lineage: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLOUDTRAIN_LINEAGE": lineage, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cloudtrain.checkpoint", *args], env=env,
                          capture_output=True, text=True)


def test_restore_refuses_another_jobs_checkpoints_and_resumes_its_own(tmp_path: Path) -> None:
    """Seen locally: a `--epochs 5` run 'resumed from step 64' written by another job in the same location."""
    local = tmp_path / "local"
    (local / "step-000000064").mkdir(parents=True)
    (local / "step-000000064" / "state.bin").write_text("someone else's")
    store = (tmp_path / "store").as_uri()
    assert run_module("sync", str(local), store, "--final", lineage="other-job-1234").returncode == 0
    manifest = json.loads((tmp_path / "store" / "step-000000064" / "manifest.json").read_text())
    assert manifest["lineage"] == "other-job-1234"
    refused = run_module("restore", store, str(tmp_path / "mine"), lineage="my-job-5678")
    assert refused.returncode == 1  # one JSON report, which the bootstrap turns into the node's error
    assert "belong to another job (lineage other-job-1234" in json.loads(refused.stdout)["error"]
    assert not (tmp_path / "mine").exists()
    resumed = run_module("restore", store, str(tmp_path / "again"), lineage="other-job-1234")
    assert resumed.returncode == 0 and json.loads(resumed.stdout) == {"step": 64}
