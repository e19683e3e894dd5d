"""The cloud fakes as fixtures, with the settings that send cloudtrain (and each cloud's SDK) to them: ``aws`` (the
SageMaker front over moto), ``azure`` (the Azure ML workspace fake over Azurite), ``vertex`` (the Vertex AI fake over
the GCS emulator), ``kube`` (the Kubernetes API fake); the fakes themselves are in tests/fakes/. conftest.py registers
these for every test module; each fake's module is imported when its fixture starts (tests/fakes/vertex.py loads
google-cloud-aiplatform), so this one costs nothing to import."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cloudtrain.testing.fixtures import ddp_project
from tests.emulators import BUCKET, ensure

if TYPE_CHECKING:
    from tests.fakes.azureml import AzureMLFake
    from tests.fakes.kubernetes import FakeKube
    from tests.fakes.sagemaker import SageMakerFront
    from tests.fakes.vertex import VertexFake

ROLE = "arn:aws:iam::123456789012:role/cloudtrain-tests"
AWS_OFFLINE = {"AWS_REGION": "eu-west-1", "CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": "my-bucket"}
GCP_OFFLINE = {"CLOUDTRAIN_GCP_PROJECT": "my-project", "CLOUDTRAIN_GCP_REGION": "europe-west4",
               "CLOUDTRAIN_GCP_BUCKET": "my-bucket"}
WORKSPACE = {"subscription_id": "sub-1", "resource_group": "rg-1", "workspace": "ws-1"}


@pytest.fixture
def aws(emulators, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[SageMakerFront]:
    import boto3

    from cloudtrain.providers.aws.provider import LOG_GROUP
    from tests.fakes.sagemaker import SageMakerFront

    ensure("s3", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    moto = emulators["s3"]
    front = SageMakerFront(moto.port)
    for key, value in {"AWS_ENDPOINT_URL_SAGEMAKER": front.url, "AWS_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": f"http://127.0.0.1:{moto.port}",
                       "CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": BUCKET}.items():
        monkeypatch.setenv(key, value)
    logs = boto3.client("logs")
    if LOG_GROUP not in [g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]]:
        logs.create_log_group(logGroupName=LOG_GROUP)
    yield front
    front.close()


def write_node_log(job: str, host: str, lines: list[str]) -> None:
    """What SageMaker does with a node's stdout: one CloudWatch stream per host."""
    import boto3

    from cloudtrain.providers.aws.provider import LOG_GROUP

    logs = boto3.client("logs")
    stream = f"{job}/{host}-1700000000"
    if not logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=stream)["logStreams"]:
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    now = int(__import__("time").time() * 1000)
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                        logEvents=[{"timestamp": now + i, "message": line} for i, line in enumerate(lines)])


def azure_project(root: Path) -> Path:
    """The DDP project with a script that prints the input Azure ML mounts (tests/test_azure.py's ``project``)."""
    proj = ddp_project(root)
    (proj / "show_input.py").write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print(f\"rank {dist.get_rank()}/{dist.get_world_size()} input={os.environ['CLOUDTRAIN_INPUT_TRAIN']}\","
        " flush=True)\n"
        "dist.destroy_process_group()\n")
    return proj


@pytest.fixture
def azure(emulators, tmp_path_factory: pytest.TempPathFactory,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureMLFake]:
    from tests.fakes.azureml import AzureMLFake

    ensure("az", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    fake = AzureMLFake(emulators["az"].port)
    monkeypatch.setenv("CLOUDTRAIN_AZURE_ENDPOINT", fake.url)
    monkeypatch.setenv("CLOUDTRAIN_AZURE_POLL", "0.2")
    yield fake
    fake.close()


def spec_file(project: Path, **extra: object) -> Path:
    import yaml

    spec = {"script": "train_ddp.py", "providers": {"azure": WORKSPACE}, **extra}
    (project / "cloudtrain.yaml").write_text(yaml.safe_dump(spec))
    return project / "cloudtrain.yaml"


@pytest.fixture
def vertex(emulators, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> Iterator[VertexFake]:
    from tests.fakes.vertex import VertexFake

    ensure("gs", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    fake = VertexFake()
    for key, value in {"CLOUDTRAIN_VERTEX_ENDPOINT": fake.url, "CLOUDTRAIN_GCP_LOGGING_ENDPOINT": fake.url,
                       "CLOUDTRAIN_GCP_PROJECT": "test-project", "CLOUDTRAIN_GCP_REGION": "us-central1",
                       "CLOUDTRAIN_GCP_BUCKET": BUCKET, "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud")}.items():
        monkeypatch.setenv(key, value)
    yield fake
    fake.close()


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    from tests.fakes.kubernetes import FakeKube

    fake = FakeKube()
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    yield fake
    fake.close()
