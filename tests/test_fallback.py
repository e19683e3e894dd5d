"""Ordered fallback (issue 31.2): plans for every leg, bad lists refused at plan time, a submit that moves on when
SageMaker refuses for quota (the real boto3 against the SageMaker front, which answers ResourceLimitExceeded at the
HTTP boundary) and lands on Vertex (the real JobServiceClient against the Vertex fake), and a job whose capacity is
gone moved to the next leg with its newest verified checkpoint copied from GCS (gcp-storage-emulator) to S3 (moto),
resumably, checked against the manifest's sha256."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import store as checkpoints
from cloudtrain.checkpoint.copy import carry_newest
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.jobs.fallback import move
from cloudtrain.jobs.recovery import load, wait_with_recovery
from cloudtrain.providers.gcp.provider import VertexProvider
from tests.conftest import cli_env, wait_for
from tests.emulators import BUCKET, ensure
from tests.fakes.sagemaker import SageMakerFront
from tests.fakes.vertex import VertexFake

ROLE = "arn:aws:iam::123456789012:role/cloudtrain-tests"
QUOTA = ("ResourceLimitExceeded", "The account-level service limit 'ml.g5.xlarge for spot training job usage' is 0 "
                                  "Instances, with current utilization of 0 Instances and a request delta of 1")


def run(project: Path, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=env or cli_env(home),
                          capture_output=True, text=True, timeout=180)


def test_plan_shows_every_leg_in_order(project: Path, ct_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": "my-bucket",
                       "CLOUDTRAIN_GCP_PROJECT": "my-project", "CLOUDTRAIN_GCP_BUCKET": "my-gbucket",
                       "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    (project / "cloudtrain.yaml").write_text(
        "script: train_ddp.py\nspot: true\nprovider: [aws, gcp]\nproviders:\n"
        "  aws: {regions: [us-east-1, us-west-2]}\n  gcp: {region: europe-west4}\n")
    planned = run(project, ct_home, "plan", "-o", "json")
    assert planned.returncode == 0, planned.stderr
    legs = json.loads(planned.stdout)["legs"]
    assert [(leg["provider"], leg["region"]) for leg in legs] == [("aws", "us-east-1"), ("aws", "us-west-2"),
                                                                 ("gcp", None)]
    assert [leg["plan"]["staging"]["region"] for leg in legs] == ["us-east-1", "us-west-2", "europe-west4"]
    text = run(project, ct_home, "plan", "-p", "gcp,aws")  # the flag wins over the spec, in its order
    assert text.returncode == 0, text.stderr
    assert text.stdout.index("leg 1/3: gcp") < text.stdout.index("leg 2/3: aws us-east-1") < \
        text.stdout.index("leg 3/3: aws us-west-2")


def test_bad_fallback_lists_exit_2_naming_the_fix(project: Path, ct_home: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("CLOUDTRAIN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    env = {**cli_env(ct_home), "CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": "my-bucket",
           "AWS_REGION": "us-east-1", "CLOUDSDK_CONFIG": str(project / "no-gcloud")}
    unknown = run(project, ct_home, "plan", "train_ddp.py", "-p", "aws,nope", env=env)
    assert unknown.returncode == 2 and "--provider: unknown provider 'nope' in the fallback list" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    missing = run(project, ct_home, "submit", "train_ddp.py", "-p", "aws,gcp", "--detach", env=env)
    assert missing.returncode == 2, missing.stderr
    assert "providers.gcp.project: is not set, and the fallback list names gcp" in missing.stderr
    assert "Traceback" not in missing.stderr and not list((ct_home / "recovery").glob("*.json"))


@pytest.fixture
def clouds(emulators, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> Iterator[tuple[SageMakerFront, VertexFake]]:
    ensure("s3", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    ensure("gs", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    front = SageMakerFront(emulators["s3"].port)  # type: ignore[union-attr]
    vertex = VertexFake()
    for key, value in {"AWS_ENDPOINT_URL_SAGEMAKER": front.url, "AWS_REGION": "us-east-1",
                       "CLOUDTRAIN_AWS_ROLE": ROLE, "CLOUDTRAIN_AWS_BUCKET": BUCKET,
                       "CLOUDTRAIN_VERTEX_ENDPOINT": vertex.url, "CLOUDTRAIN_GCP_LOGGING_ENDPOINT": vertex.url,
                       "CLOUDTRAIN_GCP_PROJECT": "test-project", "CLOUDTRAIN_GCP_REGION": "us-central1",
                       "CLOUDTRAIN_GCP_BUCKET": BUCKET, "CLOUDTRAIN_GCP_POLL": "0.05",
                       "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud")}.items():
        monkeypatch.setenv(key, value)
    yield front, vertex
    vertex.close()
    front.close()


def test_submit_moves_on_when_sagemaker_refuses_for_quota(clouds: tuple[SageMakerFront, VertexFake],
                                                          project: Path, ct_home: Path) -> None:
    front, vertex = clouds
    front.refuse_creates = [QUOTA]
    submitted = run(project, ct_home, "submit", "train_ddp.py", "-p", "aws,gcp", "--spot",
                    "--max-restarts", "1", "--detach")
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    assert handle.startswith("gcp://test-project/us-central1/") and len(vertex.jobs) == 1
    assert front.calls.count("CreateTrainingJob") == 1  # refused once, not retried there
    assert "aws refused the job for capacity or quota (creating training job" in submitted.stderr
    assert "ResourceLimitExceeded" in submitted.stderr and "trying gcp" in submitted.stderr
    status = run(project, ct_home, "status", handle)
    assert status.returncode == 0, status.stderr
    assert "lineage:" in status.stdout and "on gcp: submitted (aws refused: creating training job" in status.stdout

    # every leg refusing is an error naming each refusal
    front.refuse_creates = [QUOTA]
    vertex_refusal = run(project, ct_home, "submit", "train_ddp.py", "-p", "aws", "--spot", "--detach")
    assert vertex_refusal.returncode == 2 and "ResourceLimitExceeded" in vertex_refusal.stderr


def _publish(uri: str, step: int, payload: bytes) -> None:
    folder = storage.join(uri, f"step-{step:09d}")
    files = []
    for name, data in (("model.pt", payload), ("optim/shard-0.bin", payload[::-1])):
        storage.write_bytes(storage.join(folder, name), data)
        files.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    checkpoints.publish(folder, step, files, world_size=2, log=lambda _m: None)


def test_copy_is_verified_resumable_and_skips_a_corrupt_newest(clouds: tuple[SageMakerFront, VertexFake],
                                                               tmp_path: Path) -> None:
    source, target = f"gs://{BUCKET}/copy-{uuid.uuid4().hex[:8]}", f"s3://{BUCKET}/copy-{uuid.uuid4().hex[:8]}"
    _publish(source, 10, b"ten" * 100_000)
    _publish(source, 20, b"twenty" * 100_000)
    # the newest checkpoint's file was overwritten after its manifest: it is not carried
    storage.write_bytes(storage.join(source, "step-000000020", "model.pt"), b"torn")
    said: list[str] = []
    copied = carry_newest(source, target, said.append)
    assert copied is not None and copied.step == 10 and copied.skipped == 0
    assert any("step-000000020 is corrupt" in line for line in said)
    assert any("2/2 files" in line for line in said)  # progress
    restored = checkpoint_restore.restore_latest(target, tmp_path / "restored", log=lambda _m: None)
    assert restored is not None and restored.step == 10
    # taken up again (a copy cut short): files already there with the right hash are skipped
    storage.store_for(target).delete([storage.join(target, "step-000000010", "manifest.json")])
    again = carry_newest(source, target, said.append)
    assert again is not None and again.skipped == 2 and again.copied_bytes == 0


@pytest.mark.parametrize("follower", ["wait --recover", "Run.wait"])
def test_a_job_whose_capacity_is_gone_moves_on_with_its_checkpoint(clouds: tuple[SageMakerFront, VertexFake],
                                                                    project: Path, ct_home: Path, follower: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's follower (recovery with the fallback mover, as `wait --recover` and `watch` run it) and the SDK's
    ``Run.wait(recover=True)`` both move the job to its next leg."""
    front, vertex = clouds
    ckpt = f"gs://{BUCKET}/moving-{uuid.uuid4().hex[:8]}"
    _publish(ckpt, 7, b"weights" * 50_000)
    vertex.scripts = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "PREEMPTED"]]
    submitted = run(project, ct_home, "submit", "train_ddp.py", "-p", "gcp,aws", "--spot", "--max-restarts", "0",
                    "--checkpoint-uri", ckpt, "--detach")
    assert submitted.returncode == 0, submitted.stderr
    root = JobHandle.parse(submitted.stdout.strip())
    said: list[str] = []

    def finish_on_sagemaker() -> None:  # the moved job runs to its end on SageMaker
        wait_for(lambda: bool(front.received), timeout=120, interval=0.05)
        front.set_status(next(iter(front.received)), "Completed", "Completed")

    threading.Thread(target=finish_on_sagemaker, daemon=True).start()
    if follower == "Run.wait":
        from cloudtrain.sdk import Run

        followed = Run(root, VertexProvider())
        status = followed.wait(recover=True, poll=0.05, progress=False)
        said += capsys.readouterr().out.splitlines()  # a notebook shows what recovery did
        assert followed.handle == status.handle and followed.provider.name == "aws"
    else:
        status = wait_with_recovery(VertexProvider(), root, poll=0.05, log=said.append, mover=move)
    assert status.handle.provider == "aws" and status.state is JobState.SUCCEEDED
    chain = load(root)
    assert chain is not None and [h.split("://")[0] for h in chain.chain] == ["gcp", "aws"]
    assert chain.history[1]["why"].startswith("moved: preempted with no restarts left there")
    sent = next(iter(front.received.values()))
    target = sent["Environment"]["CLOUDTRAIN_CHECKPOINT_URI"]  # cloudtrain's protocol, not CheckpointConfig
    assert target.startswith(f"s3://{BUCKET}/cloudtrain/checkpoints/")
    restored = checkpoint_restore.restore_latest(target, project / "restored", log=lambda _m: None)
    assert restored is not None and restored.step == 7
    assert (project / "restored" / "step-000000007" / "model.pt").read_bytes() == b"weights" * 50_000
    assert any("carried step 7" in line for line in said)
    assert boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=target.split(BUCKET + "/", 1)[1])["KeyCount"] == 3


def test_goodput_replay_runs_the_real_decision_code_and_fallback_wins() -> None:
    bench = subprocess.run([sys.executable, "benchmarks/goodput.py", "--seeds", "4"], cwd=Path(__file__).parents[1],
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in bench.stdout.splitlines()
            if line.startswith(("baseline", "fallback ("))}
    baseline, fallback = rows["baseline (aws us-east-1 only)"], rows["fallback (4 legs)"]
    assert float(fallback[-7]) > float(baseline[-7])  # goodput
    assert float(fallback[-2]) > 1.0  # the job used more than one leg


@pytest.mark.slow
def test_a_checkpoint_from_an_s3_leg_resumes_bitwise_on_a_gcs_leg(emulators, tmp_path: Path,
                                                                    tmp_path_factory: pytest.TempPathFactory,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Real jobs (local provider, emulating SageMaker then Vertex nodes): the first leg checkpoints to moto's S3 and
    is preempted; its newest verified checkpoint is carried to the GCS emulator as a move does; the second leg
    resumes there and ends bitwise equal to an uninterrupted run."""
    import re

    import torch

    from tests.conftest import REPO, stop_every_job
    from tests.support import ARGS, SLOW, Cloudtrain, assert_bitwise_equal, final_weights

    ensure("s3", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    ensure("gs", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    (tmp_path / "train_ddp.py").write_text((REPO / "entrypoints" / "train_ddp.py").read_text())
    script = str(tmp_path / "train_ddp.py")
    try:
        straight = (tmp_path / "straight").as_uri()
        ct("submit", script, "--procs-per-node", "2", "--checkpoint-uri", (tmp_path / "ck0").as_uri(),
           "--output-uri", straight, *ARGS)
        s3, gs = f"s3://{BUCKET}/legs-{uuid.uuid4().hex[:8]}", f"gs://{BUCKET}/legs-{uuid.uuid4().hex[:8]}"
        handle = ct("submit", script, "--procs-per-node", "2", "--emulate", "sagemaker", "--checkpoint-uri", s3,
                    "--detach", *ARGS, *SLOW["ddp"]).stdout.strip()
        wait_for(lambda: "checkpoint step 8 published" in ct.logs(handle), timeout=180, interval=0.3)
        ct("preempt", handle)  # no restarts: the leg ends preempted after its final checkpoint
        assert ct("wait", handle, "--timeout", "120", check=False).returncode == 1
        copied = carry_newest(s3, gs, log=lambda _m: None)
        assert copied is not None and copied.step >= 8
        out = (tmp_path / "moved").as_uri()
        done = ct("submit", script, "--procs-per-node", "2", "--emulate", "vertex", "--checkpoint-uri", gs,
                  "--output-uri", out, *ARGS)
        resumed = re.search(r"INFO resumed from step (\d+)", done.stdout)
        assert resumed and int(resumed.group(1)) == copied.step, done.stdout[-3000:]
        expected: dict[str, torch.Tensor] = final_weights(straight)
        assert_bitwise_equal(final_weights(out), expected)
    finally:
        stop_every_job(tmp_path / "home")
