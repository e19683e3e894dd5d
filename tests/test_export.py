"""`cloudtrain plan ... --export DIR`: files each platform's own tools accept as they are, loaded here with each
platform's own SDK after `plan` has exited (nothing of the plan's process is left to lean on)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cloudtrain.providers.aws.validate import request_errors
from cloudtrain.registry import declaration
from tests.conftest import REPO
from tests.support import SETTINGS

AZURE = ["--set", "providers.azure.subscription_id=00000000-0000-0000-0000-000000000001", "--set",
         "providers.azure.resource_group=rg", "--set", "providers.azure.workspace=ws"]


def export(project: Path, cloud: str, folder: Path, *flags: str,
           env: dict | None = None) -> subprocess.CompletedProcess:
    # settings come only from the test (the storage emulators export GOOGLE_CLOUD_PROJECT into this process)
    ambient = {k: v for k, v in os.environ.items() if not any(k in names for names in declaration("gcp").env.values())
               and not any(k in names for names in declaration("aws").env.values())}
    env = {**ambient, **(SETTINGS if env is None else env), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train_ddp.py", "-p", cloud, "--nodes", "2",
                           "--gpus", "A100:8", "--spot", "--env", "WANDB_API_KEY=k-123", *flags, "--export",
                           str(folder)], cwd=project, env=env, capture_output=True, text=True, timeout=180)


def check_bundle(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    digest = "sha256:" + hashlib.sha256((folder / "bundle.tar.gz").read_bytes()).hexdigest()
    assert manifest["digest"] == digest and (folder / "bootstrap.py").is_file()


def the_command(folder: Path) -> str:
    text = (folder / "README.md").read_text()
    return text.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_azure_export_loads_with_load_job_as_az_ml_job_create_reads_it(project: Path, tmp_path: Path) -> None:
    from azure.ai.ml import load_job

    folder = tmp_path / "azure-job"
    result = export(project, "azure", folder, *AZURE)
    assert result.returncode == 0, result.stderr
    job = load_job(folder / "job.yaml")  # relative code: resolved beside the YAML, as the CLI does
    assert job.code == "./code"
    check_bundle(folder / "code")
    assert job.environment_variables["WANDB_API_KEY"] == "k-123"  # it runs as is: the real values
    assert (folder / "job.yaml").stat().st_mode & 0o077 == 0  # ... so only its owner reads it
    (folder / "code").rename(folder / "moved")
    with pytest.raises(Exception, match="Can't find directory or file"):  # the schema checks the folder exists
        load_job(folder / "job.yaml")
    assert the_command(folder) == ("az ml job create --file job.yaml --subscription "
                                   "00000000-0000-0000-0000-000000000001 --resource-group rg --workspace-name ws")


def test_sagemaker_export_is_a_valid_create_training_job_request(project: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sm-job"
    result = export(project, "aws", folder)
    assert result.returncode == 0, result.stderr
    request = json.loads((folder / "create-training-job.json").read_text())
    assert request_errors("sagemaker", "CreateTrainingJob", request) == []  # botocore's own service model
    check_bundle(folder / "bundle")
    prefix = request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"].rstrip("/")
    command = the_command(folder)
    assert f"aws s3 cp bundle/manifest.json {prefix}/manifest.json" in command
    assert command.endswith("aws sagemaker create-training-job --region eu-west-1 --cli-input-json "
                            "file://create-training-job.json")
    assert command.index("bundle.tar.gz") < command.index("manifest.json")  # the manifest marks the prefix whole


def test_vertex_export_parses_as_aiplatform_v1_custom_job_and_spec(project: Path, tmp_path: Path) -> None:
    from google.cloud import aiplatform_v1

    folder = tmp_path / "vertex-job"
    result = export(project, "gcp", folder)
    assert result.returncode == 0, result.stderr
    job = aiplatform_v1.CustomJob.from_json((folder / "custom-job.json").read_text(), ignore_unknown_fields=False)
    spec = aiplatform_v1.CustomJobSpec.from_json(json.dumps(yaml.safe_load((folder / "custom-job-spec.yaml")
                                                                           .read_text())), ignore_unknown_fields=False)
    assert spec == job.job_spec and len(spec.worker_pool_specs) == 2
    check_bundle(folder / "bundle")
    assert "gcloud ai custom-jobs create --project=my-project --region=europe-west4" in the_command(folder)
    assert "--config=custom-job-spec.yaml" in the_command(folder)


@pytest.mark.parametrize(("cloud", "flags", "field"), [
    ("aws", [], "providers.aws.role"),
    ("gcp", [], "providers.gcp.project"),
    ("azure", [], "providers.azure.workspace"),
])
def test_export_refuses_a_plan_that_would_not_run_as_is(project: Path, tmp_path: Path, cloud: str, flags: list,
                                                        field: str) -> None:
    folder = tmp_path / "out"
    result = export(project, cloud, folder, *flags, env={"AWS_REGION": "eu-west-1"})
    assert result.returncode == 2 and field in result.stderr and "Traceback" not in result.stderr
    assert not folder.exists()


def test_export_never_writes_into_a_folder_with_files(project: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = export(project, "aws", tmp_path)
    assert result.returncode == 2 and "not an empty folder" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "proj"]  # nothing added
