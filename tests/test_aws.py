"""The SageMaker provider: offline plans validated by botocore's model, and the whole submit -> status -> logs ->
cancel -> list path through boto3 against moto (S3, SageMaker, CloudWatch Logs) with a thin front for what moto
lacks (tests/fakes/sagemaker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import boto3
import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.errors import SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.providers.aws.images import training_image
from cloudtrain.providers.aws.provider import LOG_GROUP, SageMakerProvider
from cloudtrain.providers.aws.status import NATIVE_STATES, job_state
from cloudtrain.providers.aws.validate import request_errors
from cloudtrain.sdk import Job, Run, plan_job
from tests.clouds import AWS_OFFLINE as OFFLINE
from tests.clouds import write_node_log
from tests.conftest import REPO, cli_env, wait_for
from tests.emulators import BUCKET
from tests.fakes.sagemaker import SageMakerFront


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


# -- plans: offline, validated -------------------------------------------------------------------------

MATRIX = [
    # nodes, accelerator, explicit instance type, strategy, spot, custom image
    (1, None, None, "ddp", False, None),
    (1, "A10G:1", None, "fsdp", True, None),
    (4, "A100:8", None, "fsdp", True, None),
    (4, "H100:8", None, "ddp", False, "123456789012.dkr.ecr.eu-west-1.amazonaws.com/mine:1"),
    (1, "A100:8", "ml.p4de.24xlarge", "ddp", False, None),
    (4, None, "ml.g5.48xlarge", "fsdp", True, None),
]


@pytest.mark.parametrize(("nodes", "accel", "instance", "strategy", "spot", "image"), MATRIX)
def test_plan_matrix_validates_against_botocore(offline: None, project: Path, nodes: int, accel: str | None,
                                                instance: str | None, strategy: str, spot: bool,
                                                image: str | None) -> None:
    fields = {"script": "train_ddp.py", "source_dir": str(project), "nodes": nodes, "strategy": strategy,
              "spot": spot, "accelerator": accel, "image": {"uri": image} if image else {},
              "providers": {"aws": {"instance_type": instance}} if instance else {},
              "env": {"WANDB_API_KEY": "secret-value-1234"}}
    with Job(**fields).plan("aws") as plan:
        request = plan.request
        assert request_errors("sagemaker", "CreateTrainingJob", request) == []
        resources = request["ResourceConfig"]
        expected_type = instance or {"A10G:1": "ml.g5.xlarge", "A100:8": "ml.p4d.24xlarge",
                                     "H100:8": "ml.p5.48xlarge", None: "ml.m5.xlarge"}[accel]
        assert (resources["InstanceType"], resources["InstanceCount"]) == (expected_type, nodes)
        gpus = {"ml.p4de.24xlarge": 8, "ml.g5.48xlarge": 8}.get(expected_type) or plan.spec.gpus_per_node or 1
        assert plan.nproc_per_node == gpus
        assert request["AlgorithmSpecification"]["TrainingImage"] == image or training_image(
            "2.5", "3.11", expected_type, "eu-west-1")
        assert request["EnableManagedSpotTraining"] is spot
        stop = request["StoppingCondition"]
        assert ("MaxWaitTimeInSeconds" in stop) is spot
        assert stop.get("MaxWaitTimeInSeconds", stop["MaxRuntimeInSeconds"]) >= stop["MaxRuntimeInSeconds"]
        if spot:  # a spot job always has somewhere to resume from
            assert request["Environment"]["CLOUDTRAIN_CHECKPOINT_URI"].startswith("s3://my-bucket/")
        assert request["Environment"]["CLOUDTRAIN_STRATEGY"] == strategy
        assert [n.rank for n in plan.nodes] == list(range(nodes))
        for node in plan.nodes:
            line = node.torchrun
            assert line[line.index("--nnodes") + 1] == str(nodes)
            assert line[line.index("--node-rank") + 1] == str(node.rank)
            assert line[line.index("--master-addr") + 1] == "algo-1"
        assert "CheckpointConfig" not in request  # see cloudtrain/providers/aws/request.py
        printed = json.dumps(plan.to_dict())
        assert "secret-value-1234" not in printed and "cloudtrain:managed" in printed


def test_prebuilt_image_is_the_one_the_sagemaker_sdk_picks() -> None:
    from sagemaker.core import image_uris  # the SDK itself, as the oracle (seconds to import: tests only)

    for version, python in (("2.5", "3.11"), ("2.3", "3.11"), ("2.1", "3.10"), ("2.8", "3.12")):
        for region in ("us-east-1", "eu-west-1", "ap-southeast-2", "cn-north-1"):
            for instance in ("ml.p4d.24xlarge", "ml.g5.xlarge", "ml.m5.xlarge"):
                expected = image_uris.retrieve("pytorch", region=region, version=version,
                                               py_version="py" + python.replace(".", ""), instance_type=instance,
                                               image_scope="training")
                assert training_image(version, python, instance, region) == expected


@pytest.mark.parametrize(("flags", "field"), [
    (["--set", "providers.aws.instance_type=ml.p9.huge"], "ResourceConfig.InstanceType"),
    (["--set", "image.torch_version=1.99"], "image.torch_version"),
    (["--gpus", "A100:3"], "accelerator"),
    (["--env", "LONG=" + "x" * 600], "Environment['LONG']"),
    (["--set", "tags={aws:team: x}"], "tags.aws:team"),
    (["--set", "inputs={train: gs://b/data}"], "inputs.train"),
    (["--set", "providers.aws.role=not-an-arn"], "RoleArn"),
    (["--max-runtime", "30d"], "max_runtime"),
])
def test_bad_plans_are_refused_offline_with_the_field(project: Path, flags: list[str], field: str) -> None:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train_ddp.py", "--provider", "aws", *flags],
                            cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert field in result.stderr and "fix:" in result.stderr and "Traceback" not in result.stderr


def test_too_many_environment_variables(offline: None, project: Path) -> None:
    job = Job(script="train_ddp.py", source_dir=str(project), env={f"V{i}": "1" for i in range(101)})
    with pytest.raises(UserError, match=r"Environment: 10[0-9] items exceeds the maximum 100"):
        job.plan("aws")


def test_no_region_anywhere_is_a_clear_error(project: Path, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(SpecError, match="no AWS region"):
        Job(script="train_ddp.py", source_dir=str(project)).plan("aws")


def test_the_native_states_are_every_status_botocore_names() -> None:
    """What each pair means is the conformance suite's (TestAws): here, that the pairs it maps are SageMaker's whole
    vocabulary, as botocore's model names it (a status added there and not here would read pending forever)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    assert {p for p, _ in NATIVE_STATES} == set(model.shape_for("TrainingJobStatus").enum)
    assert {s for _, s in NATIVE_STATES if s} == set(model.shape_for("SecondaryStatus").enum)
    assert job_state("Deleting", None)[0] is JobState.CANCELLED  # an end: `wait` stops (it read pending)


# -- against the emulated service --------------------------------------------------------------------


def test_cli_submit_status_logs_cancel_list(aws: SageMakerFront, project: Path, ct_home: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=120)

    submitted = cli("submit", "train_ddp.py", "--provider", "aws", "--nodes", "2", "--gpus", "A10G:4", "--spot",
                    "--detach", "--set", "tags={team: vision}", "--", "--epochs", "1")
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    job = JobHandle.parse(handle).job_id
    assert handle == f"aws://us-east-1/{job}"

    # the bundle is staged content-addressed in S3, and the job's bundle channel points at it
    sm = boto3.client("sagemaker", endpoint_url=aws.url)
    described = sm.describe_training_job(TrainingJobName=job)
    prefix = described["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    names = [u.rsplit("/", 1)[1] for u in storage.store_for(prefix).list(prefix)]
    assert sorted(names) == ["bootstrap.py", "bundle.tar.gz", "manifest.json"]
    assert described["ResourceConfig"] == {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2,
                                           "VolumeSizeInGB": 30}
    assert described["EnableManagedSpotTraining"] is True

    status = json.loads(cli("status", handle, "-o", "json").stdout)
    assert (status["state"], status["secondary_status"]) == ("pending", "Starting")

    aws.set_status(job, "InProgress", "Training")
    write_node_log(job, "algo-1", ["[cloudtrain] node 0/2 on sagemaker", "step 1 loss 2.30"])
    write_node_log(job, "algo-2", ["[cloudtrain] node 1/2 on sagemaker"])
    assert json.loads(cli("status", handle, "-o", "json").stdout)["state"] == "running"

    follower = subprocess.Popen([sys.executable, "-m", "cloudtrain", "logs", "-f", handle], cwd=project,
                                env={**cli_env(ct_home), "CLOUDTRAIN_AWS_LOG_POLL": "0.2"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(follower.stdout or []), daemon=True)
    reader.start()
    wait_for(lambda: len(lines) >= 3, timeout=30)
    write_node_log(job, "algo-1", ["step 2 loss 2.10"])
    wait_for(lambda: any("step 2" in line for line in lines), timeout=30)

    cancelled = cli("cancel", handle, "-o", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] in ("stopping", "cancelled")
    assert aws.stop_requests == [job]
    assert follower.wait(timeout=60) == 0  # logs -f ends once the job has ended
    reader.join(5)
    assert [line.rstrip("\n") for line in lines] == [
        "[algo-1] [cloudtrain] node 0/2 on sagemaker", "[algo-1] step 1 loss 2.30",
        "[algo-2] [cloudtrain] node 1/2 on sagemaker", "[algo-1] step 2 loss 2.10"]
    assert json.loads(cli("status", handle, "-o", "json").stdout)["state"] == "cancelled"
    again = cli("cancel", handle)  # idempotent
    assert again.returncode == 0 and aws.stop_requests == [job]

    listed = json.loads(cli("list", "--provider", "aws", "-o", "json").stdout)
    assert handle in [j["handle"] for j in listed]
    mine = next(j for j in listed if j["handle"] == handle)
    assert mine["state"] == "cancelled"


def test_sdk_spot_interruption_logs_merged_and_cancel(aws: SageMakerFront, project: Path) -> None:
    """A spot job through the SDK: SageMaker's interruption is a wait, not an end; logs by stream and merged by
    CloudWatch's timestamps; cancel sends one StopTrainingJob. (A lost create reply, one job per plan, handles and the
    status JSON: the conformance suite's TestAws.)"""
    provider = SageMakerProvider()
    job = Job(script="train_ddp.py", source_dir=str(project), spot=True)
    with plan_job(job.spec, provider) as plan:
        handle = provider.submit(plan)
    run = Run(handle, provider)
    assert run.status().state is JobState.PENDING
    aws.set_status(handle.job_id, "InProgress", "Interrupted")  # spot capacity reclaimed: not an end
    status = run.status()
    assert status.state is JobState.PENDING and "resumes" in status.message
    assert status.details["spot_interruptions"] == 1
    aws.set_status(handle.job_id, "InProgress", "Training")
    write_node_log(handle.job_id, "algo-1", ["[cloudtrain] checkpoint: resuming from step 24"])
    assert list(run.logs()) == ["[algo-1] [cloudtrain] checkpoint: resuming from step 24"]
    # 29.8 logs --merge: every node's events by their CloudWatch timestamps, not stream by stream
    logs, at = boto3.client("logs"), int(__import__("time").time() * 1000) + 1000
    for host, offsets in (("algo-1", (0, 2)), ("algo-2", (1, 3))):
        stream = f"{handle.job_id}/{host}-1700000001"
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                            logEvents=[{"timestamp": at + i, "message": f"event {i}"} for i in offsets])
    merged = [line for line in run.logs(merge=True) if "event" in line]
    assert merged == ["[algo-1] event 0", "[algo-2] event 1", "[algo-1] event 2", "[algo-2] event 3"], merged
    assert run.cancel().state in (JobState.STOPPING, JobState.CANCELLED)
    assert run.wait(timeout=10, poll=0.1).state is JobState.CANCELLED
    assert aws.stop_requests == [handle.job_id]


def test_submit_without_a_role_is_refused_before_anything_is_staged(aws: SageMakerFront, project: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDTRAIN_AWS_ROLE")
    with pytest.raises(UserError, match=r"providers\.aws\.role") as info:
        Job(script="train_ddp.py", source_dir=str(project), name="no-role-job").submit("aws")
    assert info.value.exit_code == 2
    assert "CreateTrainingJob" not in aws.calls


def test_missing_and_expired_credentials_are_clear(aws: SageMakerFront, project: Path, ct_home: Path,
                                                   tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(ct_home).items() if not k.startswith("AWS_ACCESS") and
           not k.startswith("AWS_SECRET") and k not in ("AWS_SESSION_TOKEN", "AWS_PROFILE")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    result = subprocess.run([sys.executable, "-m", "cloudtrain", "status", "aws://us-east-1/some-job"], cwd=project,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no AWS credentials" in result.stderr and "aws sso login" in result.stderr
    assert "Traceback" not in result.stderr

    expired = subprocess.run([sys.executable, "-m", "cloudtrain", "status", "aws://us-east-1/some-job"],
                             cwd=project, env={**cli_env(ct_home), "AWS_ENDPOINT_URL_SAGEMAKER": aws.url + "/expired"},
                             capture_output=True, text=True, timeout=60)
    assert expired.returncode == 2, expired.stderr
    assert "ExpiredTokenException" in expired.stderr and "fix:" in expired.stderr


@pytest.mark.slow
def test_the_plan_runs_under_the_sagemaker_contract(aws: SageMakerFront, project: Path, tmp_path: Path) -> None:
    """Submit for real (staging in moto's S3), then play SageMaker: download the bundle channel the request names
    into /opt/ml/input/data/cloudtrain, write each host's resourceconfig.json, and start the request's
    ContainerEntrypoint + ContainerArguments with its Environment on two hosts. The job trains, checkpoints to S3."""
    ckpt = f"s3://{BUCKET}/contract-ckpt/{os.urandom(4).hex()}"
    job = Job(script="train_ddp.py", source_dir=str(project), nodes=2, procs_per_node=1,
              checkpoint={"uri": ckpt}, args=["--epochs", "1", "--checkpoint-every", "8"])
    run = job.submit("aws")
    request = aws.received[run.handle.job_id]  # as boto3 serialised it and the service received it
    spec = request["AlgorithmSpecification"]
    procs = []
    port = __import__("tests.emulators", fromlist=["free_port"]).free_port()
    for host in ("algo-1", "algo-2"):
        root = tmp_path / host / "opt" / "ml"  # this host's /opt/ml

        def here(arg: str, root: Path = root) -> str:
            return arg.replace("/opt/ml", str(root))

        channel = request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
        target = root / "input" / "data" / request["InputDataConfig"][0]["ChannelName"]
        target.mkdir(parents=True)
        store = storage.store_for(channel)
        for uri in store.list(channel):
            store.get_file(uri, target / uri.rsplit("/", 1)[1])
        config = root / "input" / "config" / "resourceconfig.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"current_host": host, "hosts": ["algo-1", "algo-2"],
                                      "network_interface_name": "lo", "current_instance_type": "ml.m5.xlarge"}))
        env = {**os.environ, **request["Environment"], "SAGEMAKER_BASE_DIR": str(root), "CUDA_VISIBLE_DEVICES": "",
               "OMP_NUM_THREADS": "1", "CLOUDTRAIN_MASTER_OVERRIDE": f"127.0.0.1:{port}"}
        entry = [sys.executable if a == "python3" else here(a) for a in spec["ContainerEntrypoint"]]
        procs.append(subprocess.Popen([*entry, *[here(a) for a in spec["ContainerArguments"]]], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "node 0/2 on sagemaker: 1 processes, rendezvous static" in outputs[0]
    assert "node 1/2 on sagemaker: 1 processes, rendezvous static" in outputs[1]
    assert [c.step for c in checkpoint_store.list_complete(ckpt)] == [24, 32]
    # the job's outputs, found from the job as SageMaker describes it: the final model and each node's logs
    files = {f.name: f for f in run.outputs()}
    assert "model.pt" in files and files["model.pt"].uri.startswith(f"s3://{BUCKET}/cloudtrain/outputs/")
    for node in ("node-0", "node-1"):
        assert any(name.startswith(f"logs/{node}/") and name.endswith("stdout.log") for name in files), files
    fetched = {f.name: f.path for f in run.outputs(download=tmp_path / "out")}
    assert fetched["model.pt"] is not None and fetched["model.pt"].stat().st_size > 1000


def test_planning_imports_only_botocore(project: Path) -> None:
    """Planning reads botocore's model and sagemaker-core's image JSON; it imports neither boto3 nor the SageMaker
    SDK (seconds), nor torch or the other clouds."""
    code = (f"from cloudtrain.sdk import Job\n"
            f"Job(script='train_ddp.py', source_dir={str(project)!r}, accelerator='A100:8')"
            ".plan('aws').package.close()")
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, **OFFLINE}, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    top = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in result.stderr.splitlines()
           if line.startswith("import time:") and "|" in line}
    assert "botocore" in top
    assert top.isdisjoint({"boto3", "sagemaker", "torch", "azure", "google", "pandas"})
