"""docs/fidelity.md stays true: for each cloud, the request cloudtrain plans for one job (2 nodes of A100:8, spot) is
compared field by field with the request the platform's own SDK builds for the same job, and the fields that differ
(or that only one side sends) must be exactly the rows docs/fidelity.md marks so, each with its reason. A new
difference, or one that went away, fails here until the doc's table says so.

The SDK sides, built offline:
- SageMaker: ModelTrainer (``sagemaker.train``, the SageMaker SDK v3) is not a test dependency (its package pulls in
  about 1 GB); its ``_create_training_job_args`` is re-done here from sagemaker-core's own parts: the shapes, the
  ``modules.configs`` (Compute, StoppingCondition, OutputDataConfig with ModelTrainer's GZIP default,
  CheckpointConfig), ``modules.constants`` (the /bin/bash sm_train.sh entry point, the ``code`` and ``sm_drivers``
  channels), ``image_uris.retrieve`` and ``utils.serialize`` into the boto3 request.
- Azure ML: azure-ai-ml's ``command()`` with a PyTorch distribution of 8 processes per node and the curated ACPT
  environment at ``labels/latest``; the REST body as the SDK builds it (``_to_job()._to_rest_object()``).
- Vertex: aiplatform's ``CustomJob.from_local_script`` with the prebuilt PyTorch container and 2 replicas (2 worker
  pools), submitted with SPOT; the script package goes to the GCS emulator and the create request to the local
  Vertex fake (tests/fakes/vertex.py), so the body compared is the one the SDK put on the wire.
Names the user chooses (job name, role, output path, compute) are given the same values on both sides.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.sdk import Job
from tests.conftest import REPO
from tests.emulators import BUCKET, ensure
from tests.fakes.vertex import VertexFake

DOC = REPO / "docs" / "fidelity.md"
SETTINGS = {
    "aws": {"region": "us-east-1", "role": "arn:aws:iam::123456789012:role/x", "bucket": "my-bucket"},
    "azure": {"subscription_id": "00000000-0000-0000-0000-000000000000", "resource_group": "rg", "workspace": "ws",
              "compute": "gpu-cluster"},
    "gcp": {"project": "my-project", "region": "us-central1", "bucket": "my-bucket"},
}
# maps sent as one value (their entries are cloudtrain's own variables, tags and labels): one row each
ATOMIC = {"Environment", "Tags", "HyperParameters", "environmentVariables", "tags", "inputs", "outputs", "env",
          "labels", "properties.properties"}
STATUSES = ("same", "differs", "cloudtrain only", "SDK only")


def planned(provider: str, project: Path) -> dict[str, Any]:
    spec = Job(script="train.py", source_dir=str(project), nodes=2, accelerator="A100:8", spot=True,
               providers={provider: SETTINGS[provider]})
    plan = spec.plan(provider)
    plan.package.close()
    return json.loads(json.dumps(plan.request))


# -- the SDK sides ------------------------------------------------------------------------------------------


def sagemaker_request(ours: dict[str, Any]) -> dict[str, Any]:
    """What ModelTrainer(source_code=SourceCode(source_dir, entry_script), distributed=Torchrun(), compute=Compute(
    2 x ml.p4d.24xlarge, spot), checkpoint_config=...).train() sends, from sagemaker-core's parts (see above)."""
    from sagemaker.core import image_uris, shapes
    from sagemaker.core.apiutils._boto_functions import to_pascal_case
    from sagemaker.core.modules import configs, constants
    from sagemaker.core.modules.distributed import Torchrun
    from sagemaker.core.utils.utils import serialize

    name, bucket = ours["TrainingJobName"], SETTINGS["aws"]["bucket"]
    resources, stop = ours["ResourceConfig"], ours["StoppingCondition"]
    assert Torchrun().driver_script == "torchrun_driver.py"  # what sm_train.sh runs on each node

    def channel(channel_name: str) -> configs.Channel:  # where ModelTrainer uploads a local folder
        uri = f"s3://{bucket}/train/{name}/input/{channel_name}"
        return configs.Channel(channel_name=channel_name, input_mode="File", data_source=configs.DataSource(
            s3_data_source=configs.S3DataSource(s3_data_type="S3Prefix", s3_uri=uri,
                                                s3_data_distribution_type="FullyReplicated")))

    image = image_uris.retrieve("pytorch", region=SETTINGS["aws"]["region"], version="2.5", py_version="py311",
                                instance_type=resources["InstanceType"], image_scope="training")
    request = {
        "training_job_name": name, "role_arn": ours["RoleArn"],
        "algorithm_specification": shapes.AlgorithmSpecification(
            training_image=image, training_input_mode="File",
            container_entrypoint=constants.DEFAULT_CONTAINER_ENTRYPOINT,
            container_arguments=constants.DEFAULT_CONTAINER_ARGUMENTS),
        "hyper_parameters": {},
        "input_data_config": [channel(constants.SM_CODE), channel(constants.SM_DRIVERS)],
        "resource_config": configs.Compute(instance_type=resources["InstanceType"],
                                           instance_count=resources["InstanceCount"],
                                           enable_managed_spot_training=True)._to_resource_config(),
        "stopping_condition": configs.StoppingCondition(max_runtime_in_seconds=stop["MaxRuntimeInSeconds"],
                                                        max_wait_time_in_seconds=stop["MaxWaitTimeInSeconds"]),
        "output_data_config": configs.OutputDataConfig(s3_output_path=ours["OutputDataConfig"]["S3OutputPath"],
                                                       compression_type="GZIP"),  # TrainDefaults' default
        # what SageMaker's managed spot guide asks for, so an interrupted job resumes
        "checkpoint_config": configs.CheckpointConfig(s3_uri=f"s3://{bucket}/train/{name}/checkpoints",
                                                      local_path="/opt/ml/checkpoints"),
        "environment": {}, "enable_managed_spot_training": True,
    }
    return dict(serialize({to_pascal_case(k): v for k, v in request.items()}))


def azureml_request(ours: dict[str, Any], project: Path) -> dict[str, Any]:
    from azure.ai.ml import command

    body = ours["rest"]["properties"]
    env = re.sub(r"/versions/[^/]+$", "/labels/latest", body["environmentId"])  # the curated env, as its docs show
    job = command(code=str(project), command="python train.py", environment=env, compute=body["computeId"],
                  instance_count=body["resources"]["instanceCount"],
                  distribution={"type": "pytorch", "process_count_per_instance": 8},
                  name=ours["rest"]["name"], display_name=body["displayName"],
                  experiment_name=body["experimentName"], timeout=ours["job"]["limits"]["timeout"])
    rest = job._to_job()._to_rest_object()
    return dict(json.loads(json.dumps(rest.as_dict(), default=str)))


def vertex_request(ours: dict[str, Any], project: Path, fake: VertexFake, monkeypatch: pytest.MonkeyPatch
                   ) -> dict[str, Any]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer

    monkeypatch.setattr(initializer, "global_config", initializer._Config())  # aiplatform's settings are global
    initializer.global_config.init(project=SETTINGS["gcp"]["project"], location=SETTINGS["gcp"]["region"],
                                   staging_bucket=f"gs://{BUCKET}", credentials=AnonymousCredentials(),
                                   api_endpoint=fake.url, api_transport="rest")
    job_spec = ours["customJob"]["jobSpec"]
    machine = job_spec["workerPoolSpecs"][0]["machineSpec"]
    job = aiplatform.CustomJob.from_local_script(
        display_name=ours["customJob"]["displayName"], script_path=str(project / "train.py"),
        container_uri=job_spec["workerPoolSpecs"][0]["containerSpec"]["imageUri"], replica_count=2,
        machine_type=machine["machineType"], accelerator_type=machine["acceleratorType"],
        accelerator_count=machine["acceleratorCount"],
        base_output_dir=job_spec["baseOutputDirectory"]["outputUriPrefix"])
    job.submit(timeout=int(job_spec["scheduling"]["timeout"].rstrip("s")),
               scheduling_strategy=aiplatform.compat.types.custom_job.Scheduling.Strategy.SPOT)
    [sent] = fake.received.values()
    return sent


def vertex_canonical(job: dict[str, Any]) -> dict[str, Any]:
    """A CustomJob as aiplatform_v1's proto reads it (MessageToDict: enum names, int64 as text, no defaults), on
    both sides alike: the SDK's REST transport sends enums as numbers, cloudtrain's plan shows their names."""
    from google.cloud.aiplatform_v1 import CustomJob
    from google.protobuf.json_format import MessageToDict

    return dict(MessageToDict(CustomJob.pb(CustomJob.from_json(json.dumps(job)))))


# -- comparing ------------------------------------------------------------------------------------------------


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Leaves by dotted path; list items by their ChannelName or index, then indexes folded to [*]; empty maps and
    lists dropped (they send nothing)."""
    if value in ({}, [], None):
        return {}
    if path in ATOMIC or path.rsplit(".", 1)[-1] in ATOMIC:
        return {path: value}
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found.update(flatten(item, f"{path}.{key}" if path else key))
        return found
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        found = {}
        for i, item in enumerate(value):
            key = item.get("ChannelName", i)
            found.update({f"{path}[{key}]": item} if "ChannelName" in item else flatten(item, f"{path}[{key}]"))
        return found
    return {path: value}


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, str]:
    """Field -> same / differs / cloudtrain only / SDK only; worker pools folded into [*] where they agree."""
    a, b = flatten(ours), flatten(theirs)
    found: dict[str, set[str]] = {}
    for key in a.keys() | b.keys():
        status = ("cloudtrain only" if key not in b else "SDK only" if key not in a
                  else "same" if a[key] == b[key] else "differs")
        found.setdefault(re.sub(r"\[\d+\]", "[*]", key), set()).add(status)
    folded = {key: statuses.pop() for key, statuses in found.items() if len(statuses) == 1}
    assert len(folded) == len(found), f"worker pools disagree: {sorted(set(found) - set(folded))}"
    return folded


def documented(provider: str) -> dict[str, str]:
    """The rows of the table after ``<!-- fidelity:<provider> -->`` in docs/fidelity.md: field -> status."""
    text = DOC.read_text()
    start = text.index(f"<!-- fidelity:{provider} -->")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 5 or not cells[0].startswith("`"):
            continue
        field, status = cells[0].strip("`"), cells[3].strip("*")
        assert status in STATUSES, f"{provider}: {field}: status {status!r} is none of {STATUSES}"
        assert status == "same" or cells[4], f"{provider}: {field} differs without a reason in docs/fidelity.md"
        rows[field] = status
    return rows


def assert_documented(provider: str, ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, str]:
    found, doc = compare(ours, theirs), documented(provider)
    a, b = flatten(ours), flatten(theirs)

    def row(key: str) -> str:
        def shown(side: dict[str, Any]) -> str:
            value = next((v for k, v in side.items() if re.sub(r"\[\d+\]", "[*]", k) == key), None)
            return "—" if value is None else f"`{json.dumps(value)[:60]}`"

        return f"| `{key}` | {shown(a)} | {shown(b)} | {found[key]} | |"

    wrong = sorted(k for k in found.keys() | doc.keys() if found.get(k) != doc.get(k))
    assert not wrong, (f"docs/fidelity.md's {provider} table is out of date for {wrong}; what the requests show "
                       "now:\n" + "\n".join(row(k) if k in found else f"(remove `{k}`)" for k in wrong))
    assert any(s != "same" for s in found.values())  # the comparison saw both requests, not one twice
    return found


# -- the tests ------------------------------------------------------------------------------------------------


def test_sagemaker_request_vs_model_trainer(project: Path) -> None:
    (project / "train_ddp.py").rename(project / "train.py")
    ours = planned("aws", project)
    found = assert_documented("aws", ours, sagemaker_request(ours))
    # every field cloudtrain sends is one the SDK's own create call can send too
    from sagemaker.core.resources import TrainingJob

    params = {p.replace("_", "") for p in inspect.signature(TrainingJob.create).parameters}
    assert {k.split(".")[0].split("[")[0].lower() for k in found} <= params


def test_azureml_request_vs_command_job(project: Path) -> None:
    (project / "train_ddp.py").rename(project / "train.py")
    ours = planned("azure", project)
    assert_documented("azure", ours["rest"], azureml_request(ours, project))


def test_vertex_request_vs_custom_job_from_local_script(project: Path, emulators, tmp_path_factory,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ensure("gs", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    (project / "train_ddp.py").rename(project / "train.py")
    ours = planned("gcp", project)["customJob"]
    fake = VertexFake()
    try:
        theirs = vertex_request({"customJob": ours}, project, fake, monkeypatch)
    finally:
        fake.close()
    assert_documented("gcp", vertex_canonical(ours), vertex_canonical(theirs))
