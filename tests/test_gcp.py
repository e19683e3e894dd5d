"""The Vertex AI provider: offline plans checked against aiplatform_v1's own types, and the whole submit -> status ->
logs -> cancel -> list -> recover path through the real JobServiceClient (REST transport, anonymous credentials)
against a local fake of the customJobs and Cloud Logging APIs (tests/fakes/vertex.py), with staging on
gcp-storage-emulator through the real google-cloud-storage client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from google.cloud.aiplatform_v1 import CustomJob

from cloudtrain import storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.errors import CredentialsError, HandleError, SpecError, UserError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.providers.gcp import request as rq
from cloudtrain.providers.gcp.provider import VertexProvider
from cloudtrain.providers.gcp.schema import derive, request_errors, snapshot
from cloudtrain.providers.gcp.status import NATIVE_STATES, job_state
from cloudtrain.sdk import Job, Run, plan_job
from tests.clouds import GCP_OFFLINE as OFFLINE
from tests.conftest import REPO, cli_env, wait_for
from tests.emulators import BUCKET, free_port
from tests.fakes.vertex import VertexFake


def cloudtrain_argv() -> list[str]:
    return [sys.executable, "-m", "cloudtrain"]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def parses(job: dict) -> CustomJob:
    """The SDK's own JSON parser, strict: an unknown field or enum value raises."""
    return CustomJob.from_json(json.dumps(job), ignore_unknown_fields=False)


# -- plans: offline, validated -------------------------------------------------------------------------

MATRIX = [
    # nodes, accelerator, explicit machine type, explicit accelerator type, strategy, spot, custom image
    (1, None, None, None, "ddp", False, None),
    (1, "L4:1", None, None, "fsdp", True, None),
    (4, "A100:8", None, None, "fsdp", True, None),
    (4, "H100:8", None, None, "ddp", False, "europe-docker.pkg.dev/my-project/train/mine:1"),
    (1, "A100-80GB:8", "a2-ultragpu-8g", None, "ddp", False, None),
    (4, None, "n1-highmem-16", "NVIDIA_TESLA_T4", "fsdp", True, None),
    (4, None, "a3-highgpu-8g", None, "ddp", False, None),
]
EXPECTED = {"L4:1": ("g2-standard-8", "NVIDIA_L4", 1), "A100:8": ("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8),
            "H100:8": ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8),
            "A100-80GB:8": ("a2-ultragpu-8g", "NVIDIA_A100_80GB", 8), "n1-highmem-16": ("n1-highmem-16",
                                                                                      "NVIDIA_TESLA_T4", 1),
            "a3-highgpu-8g": ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8), None: ("n1-standard-8", None, 0)}


@pytest.mark.parametrize(("nodes", "accel", "machine", "accel_type", "strategy", "spot", "image"), MATRIX)
def test_plan_matrix_round_trips_through_aiplatform_types(offline: None, project: Path, nodes: int,
                                                          accel: str | None, machine: str | None,
                                                          accel_type: str | None, strategy: str, spot: bool,
                                                          image: str | None) -> None:
    gcp = {k: v for k, v in {"machine_type": machine, "accelerator_type": accel_type}.items() if v}
    fields = {"script": "train_ddp.py", "source_dir": str(project), "nodes": nodes, "strategy": strategy,
              "spot": spot, "accelerator": accel, "image": {"uri": image} if image else {},
              "providers": {"gcp": gcp}, "inputs": {"train": "gs://data-bucket/train"},
              "env": {"WANDB_API_KEY": "secret-value-1234"}, "tags": {"Team": "Vision", "cost-center": "42"}}
    with Job(**fields).plan("gcp") as plan:
        request = plan.request
        job = request["customJob"]
        assert request["parent"] == "projects/my-project/locations/europe-west4"
        assert request_errors(job) == []
        parsed = parses(job)
        assert json.loads(CustomJob.to_json(parsed, use_integers_for_enums=False))["displayName"] == plan.job_id
        pools = job["jobSpec"]["workerPoolSpecs"]
        assert [p["replicaCount"] for p in pools] == ([1, nodes - 1] if nodes > 1 else [1])
        machine_type, accelerator, count = EXPECTED[accel if accel else machine]
        for pool in pools:
            assert pool["machineSpec"].get("machineType") == machine_type
            assert pool["machineSpec"].get("acceleratorType") == accelerator
            assert pool["machineSpec"].get("acceleratorCount", 0) == count
            container = pool["containerSpec"]
            assert container["imageUri"] == (image or "europe-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4"
                                                      ".py310:latest")
            # the bootstrap and bundle are read through the /gcs mount of the staged prefix
            mounted = "/gcs/" + plan.staging["prefix"].removeprefix("gs://")
            assert container["command"] == ["python", f"{mounted}/bootstrap.py"]
            assert container["args"][:2] == ["--bundle", f"{mounted}/bundle.tar.gz"]
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["CLOUDTRAIN_INPUT_TRAIN"] == "/gcs/data-bucket/train"
            assert env["CLOUDTRAIN_STRATEGY"] == strategy
            if spot:  # a spot job always has somewhere to resume from
                assert env["CLOUDTRAIN_CHECKPOINT_URI"].startswith("gs://my-bucket/cloudtrain/checkpoints/")
        scheduling = job["jobSpec"]["scheduling"]
        assert scheduling["timeout"] == "86400s"
        assert scheduling.get("strategy") == ("SPOT" if spot else None)
        assert scheduling.get("restartJobOnWorkerRestart", False) is (nodes > 1)
        # each job's outputs in a folder of their own, which the nodes also see as CLOUDTRAIN_OUTPUT_URI
        output = f"gs://my-bucket/cloudtrain/outputs/{plan.job_id}"
        assert job["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"] == output
        assert env["CLOUDTRAIN_OUTPUT_URI"] == output
        labels = job["labels"]
        assert labels["team"] == "vision" and labels[rq.MANAGED_LABEL] == "true"
        assert labels[rq.PLAN_LABEL] == plan.job_id and labels[rq.MAX_RESTARTS_LABEL] == "0"
        assert plan.nproc_per_node == (count or 1)
        assert [n.rank for n in plan.nodes] == list(range(nodes))
        for node in plan.nodes:
            line = node.torchrun
            assert line[line.index("--nnodes") + 1] == str(nodes)
            assert line[line.index("--node-rank") + 1] == str(node.rank)
            assert line[line.index("--master-addr") + 1] == "workerpool0-0"
        printed = json.dumps(plan.to_dict())
        assert "secret-value-1234" not in printed


def test_schema_snapshot_is_what_the_installed_sdk_defines() -> None:
    """The offline check reads a snapshot of aiplatform_v1's CustomJob types; it must match the installed SDK."""
    assert derive() == snapshot()


@pytest.mark.parametrize(("change", "error"), [
    (lambda j: j["jobSpec"].update(tensorBoard="x"), "jobSpec.tensorBoard: unknown field"),
    (lambda j: j["jobSpec"]["workerPoolSpecs"][0]["machineSpec"].update(acceleratorType="NVIDIA_A1000"),
     "'NVIDIA_A1000' is not one of"),
    (lambda j: j["jobSpec"]["scheduling"].update(strategy="CHEAP"), "'CHEAP' is not one of"),
    (lambda j: j["jobSpec"]["scheduling"].update(timeout="1 day"), "is not a duration"),
    (lambda j: j["jobSpec"]["workerPoolSpecs"][0].update(replicaCount="two"), "expected an integer"),
])
def test_unknown_fields_and_bad_enums_fail_offline_and_in_the_sdk(offline: None, project: Path, change,
                                                                   error: str) -> None:
    with Job(script="train_ddp.py", source_dir=str(project), accelerator="T4:1").plan("gcp") as plan:
        job = json.loads(json.dumps(plan.request["customJob"]))
    change(job)
    assert any(error in line for line in request_errors(job)), request_errors(job)
    with pytest.raises(Exception):  # noqa: B017 - json_format.ParseError or a proto-plus ValueError
        parses(job)


def test_limits_the_proto_does_not_check(offline: None, project: Path) -> None:
    with pytest.raises(UserError, match=r"env: 10[0-9] items exceeds the maximum 100"):
        Job(script="train_ddp.py", source_dir=str(project), env={f"V{i}": "1" for i in range(101)}).plan("gcp")
    with Job(script="train_ddp.py", source_dir=str(project)).plan("gcp") as plan:
        job = json.loads(json.dumps(plan.request["customJob"]))
    job["labels"]["Bad Key"] = "x"
    job["labels"]["ok"] = "UPPER"
    job["displayName"] = "x" * 129
    errors = "\n".join(request_errors(job))
    assert "labels key 'Bad Key'" in errors and "labels['ok']" in errors and "displayName" in errors


def test_flex_start_scheduling_round_trips(offline: None, project: Path) -> None:
    job = Job(script="train_ddp.py", source_dir=str(project), nodes=2,
              providers={"gcp": {"capacity": "flex_start", "flex_start_max_wait": "2h"}})
    with job.plan("gcp") as plan:
        schedule = plan.request["customJob"]["jobSpec"]["scheduling"]
    assert schedule == {"timeout": "86400s", "restartJobOnWorkerRestart": True, "strategy": "FLEX_START",
                        "maxWaitDuration": "7200s"}
    parses({"displayName": "x", "jobSpec": {"scheduling": schedule}})


def test_image_versions(offline: None, project: Path) -> None:
    with Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": "2.1",
                                                                    "python_version": "3.10"}).plan("gcp") as plan:
        pool = plan.request["customJob"]["jobSpec"]["workerPoolSpecs"][0]
        assert pool["containerSpec"]["imageUri"] == \
            "europe-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest"
    with pytest.raises(SpecError, match=r"has Python 3\.10, not 3\.12"):
        Job(script="train_ddp.py", source_dir=str(project), image={"torch_version": "2.4",
                                                                   "python_version": "3.12"}).plan("gcp")


@pytest.mark.parametrize(("flags", "field"), [
    (["--set", "providers.gcp.accelerator_type=NVIDIA_A1000", "--gpus", "T4:1"], "acceleratorType"),
    (["--set", "image.torch_version=1.0"], "image.torch_version"),
    (["--gpus", "A100:3"], "accelerator"),
    (["--set", "inputs={train: s3://b/data}"], "inputs.train"),
])
def test_bad_plans_are_refused_offline_with_the_field(project: Path, tmp_path: Path, flags: list[str],
                                                      field: str) -> None:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO), "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud")}
    result = subprocess.run([*cloudtrain_argv(), "plan", "train_ddp.py", "--provider", "gcp", *flags],
                            cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert field in result.stderr and "fix:" in result.stderr and "Traceback" not in result.stderr


def test_the_native_states_are_every_state_of_vertex() -> None:
    """What each state means is the conformance suite's (TestGcp): here, that the states it maps are Vertex's whole
    JobState enum, as aiplatform's types name it."""
    from google.cloud.aiplatform_v1.types import job_state as vertex_states

    assert set(NATIVE_STATES) == {state.name for state in vertex_states.JobState}


def test_a_job_vertex_restarts_is_pending_with_a_note() -> None:
    state, message = job_state("JOB_STATE_PENDING", "", started=True)  # it ran, and is being started again
    assert state is JobState.PENDING and "restart" in message and "checkpoint" in message


def test_planning_imports_no_google_sdk(project: Path) -> None:
    """Planning reads cloudtrain's own tables and the schema snapshot: no aiplatform (seconds), no google-auth."""
    code = (f"from cloudtrain.sdk import plan_job, Job\n"
            f"from cloudtrain.providers.gcp.provider import VertexProvider\n"
            f"plan_job(Job(script='train_ddp.py', source_dir={str(project)!r}, accelerator='A100:8', nodes=2).spec,"
            " VertexProvider()).package.close()")
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, **OFFLINE}, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    top = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in result.stderr.splitlines()
           if line.startswith("import time:") and "|" in line}
    assert top.isdisjoint({"google", "grpc", "boto3", "botocore", "torch", "azure", "pandas"})


# -- against the fake service and the GCS emulator ----------------------------------------------------


def test_cli_submit_status_logs_cancel_list(vertex: VertexFake, project: Path, ct_home: Path) -> None:
    env = {**cli_env(ct_home), "CLOUDTRAIN_GCP_LOG_POLL": "0.2"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cloudtrain_argv(), *args], cwd=project, env=env, capture_output=True, text=True,
                              timeout=120)

    submitted = cli("submit", "train_ddp.py", "--provider", "gcp", "--nodes", "3", "--gpus", "L4:4", "--spot",
                    "--detach", "--set", "tags={team: vision}", "--", "--epochs", "1")
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    job_id = JobHandle.parse(handle).job_id
    assert handle == f"gcp://test-project/us-central1/{job_id}" and job_id.isdigit()

    # the bundle is staged content-addressed in GCS, and the job reads it through the /gcs mount of that prefix
    received = vertex.received[job_id]
    pools = received["jobSpec"]["workerPoolSpecs"]
    bundle = pools[0]["containerSpec"]["args"][1]
    prefix = "gs://" + bundle.removeprefix("/gcs/").rsplit("/", 1)[0]
    names = [u.rsplit("/", 1)[1] for u in storage.store_for(prefix).list(prefix)]
    assert sorted(names) == ["bootstrap.py", "bundle.tar.gz", "manifest.json"]
    assert [int(p["replicaCount"]) for p in pools] == [1, 2]
    assert pools[0]["machineSpec"]["machineType"] == "g2-standard-48"
    assert received["labels"]["team"] == "vision"

    status = json.loads(cli("status", handle, "-o", "json").stdout)
    assert (status["state"], status["vertex_state"], status["spot"], status["node_count"]) == \
        ("pending", "JOB_STATE_QUEUED", True, 3)

    vertex.set_state(job_id, "JOB_STATE_RUNNING")
    vertex.write_log(job_id, "workerpool0-0", ["[cloudtrain] node 0/3 on vertex", "step 1 loss 2.30"])
    vertex.write_log(job_id, "workerpool1-0", ["[cloudtrain] node 1/3 on vertex"])

    follower = subprocess.Popen([*cloudtrain_argv(), "logs", "-f", handle], cwd=project, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(follower.stdout or []), daemon=True)
    reader.start()
    wait_for(lambda: len(lines) >= 3, timeout=30)
    vertex.write_log(job_id, "workerpool0-0", ["step 2 loss 2.10"])
    wait_for(lambda: any("step 2" in line for line in lines), timeout=30)

    cancelled = cli("cancel", handle, "-o", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] in ("stopping", "cancelled")
    assert vertex.cancel_requests == [job_id]
    assert follower.wait(timeout=60) == 0  # logs -f ends once the job has ended
    reader.join(5)
    assert [line.rstrip("\n") for line in lines] == [
        "[workerpool0-0] [cloudtrain] node 0/3 on vertex", "[workerpool0-0] step 1 loss 2.30",
        "[workerpool1-0] [cloudtrain] node 1/3 on vertex", "[workerpool0-0] step 2 loss 2.10"]
    again = cli("cancel", handle)  # idempotent: the job has ended, nothing is sent
    assert again.returncode == 0 and f"{handle}  cancelled" in again.stdout and vertex.cancel_requests == [job_id]

    listed = json.loads(cli("list", "--provider", "gcp", "-o", "json").stdout)
    mine = [j for j in listed if j["handle"] == handle]
    assert len(mine) == 1 and mine[0]["state"] == "cancelled"

    # list looks first at the project here: ./cloudtrain.yaml's providers.gcp wins over the environment's project
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cloudtrain.yaml").write_text("script: train.py\nproviders:\n  gcp:\n    project: other-project\n")
    there = subprocess.run([*cloudtrain_argv(), "list", "--provider", "gcp", "-o", "json"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=120)
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout) == []


def test_sdk_a_second_plan_stages_nothing_new_then_logs_and_cancel(vertex: VertexFake, project: Path) -> None:
    """Two plans of one source through the SDK: the second stages nothing new in GCS and is a second job; logs come
    oldest first (merged or not); cancel ends it; an id Vertex does not have is NOT_FOUND. (A lost create reply,
    one job per plan, handles and the status JSON: the conformance suite's TestGcp.)"""
    provider = VertexProvider()
    job = Job(script="train_ddp.py", source_dir=str(project), spot=True)
    with plan_job(job.spec, provider) as plan:
        handle = provider.submit(plan)
    with plan_job(job.spec, provider) as plan:
        manifest = plan.staging["prefix"] + "/manifest.json"
        before = storage.read_bytes(manifest)
        second = provider.submit(plan)
        assert storage.read_bytes(manifest) == before
    assert second != handle and vertex.calls.count("create") == 2
    run = Run(handle, provider)
    assert run.status().state is JobState.PENDING
    vertex.set_state(handle.job_id, "JOB_STATE_RUNNING")
    vertex.write_log(handle.job_id, "workerpool0-0", ["[cloudtrain] checkpoint: resuming from step 24"])
    assert list(run.logs()) == ["[workerpool0-0] [cloudtrain] checkpoint: resuming from step 24"]
    assert list(run.logs(merge=True)) == list(run.logs())  # 29.8: Cloud Logging's entries come oldest first
    assert run.cancel().state in (JobState.STOPPING, JobState.CANCELLED)
    assert run.wait(timeout=10, poll=0.05).state is JobState.CANCELLED
    with pytest.raises(HandleError, match="NOT_FOUND"):
        provider.describe(JobHandle("gcp", "123", ("test-project", "us-central1")))


SCRIPTS = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "PREEMPTED"]] * 2 + \
          [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]]


def test_sdk_recovery_resubmits_a_job_preempted_twice(vertex: VertexFake, project: Path, ct_home: Path) -> None:
    provider = VertexProvider()
    vertex.scripts = [list(s) for s in SCRIPTS]
    run = Job(script="train_ddp.py", source_dir=str(project), nodes=2, spot=True, max_restarts=2,
              checkpoint={"uri": f"gs://{BUCKET}/ckpt"}).submit("gcp")
    root = run.handle
    assert provider.describe(root).max_restarts == 2  # read back from the job's label
    status = run.wait(poll=0.01, recover=True)
    assert status.state is JobState.SUCCEEDED
    assert status.recovery["restarts"] == 2 and len(vertex.jobs) == 3
    jobs = sorted(vertex.jobs.values(), key=lambda j: j["createTime"])
    names = [j["displayName"] for j in jobs]
    assert names[1:] == [f"{root.job_id}-r1", f"{root.job_id}-r2"]  # recovery names restarts after the root's id
    # each resubmission is the same job as Vertex held it: same spec (bundle, checkpoint URI, env), no output fields
    assert all(j["jobSpec"] == jobs[0]["jobSpec"] for j in jobs)
    assert [j["labels"].get(rq.RESUBMIT_LABEL) for j in jobs] == [None, jobs[0]["name"].rsplit("/", 1)[1],
                                                                   jobs[1]["name"].rsplit("/", 1)[1]]
    assert all("state" not in body and "name" not in body for body in vertex.received.values())
    assert run.handle != root and run.status().details["resubmission_of"] == jobs[1]["name"].rsplit("/", 1)[1]
    # a resubmission retried after a crash finds the job it already created
    assert provider.resubmit(root, f"{root.job_id}-r1").job_id == jobs[1]["name"].rsplit("/", 1)[1]
    assert len(vertex.jobs) == 3


def test_cli_wait_recover_resubmits_a_job_preempted_twice(vertex: VertexFake, project: Path, ct_home: Path) -> None:
    vertex.scripts = [list(s) for s in SCRIPTS]
    env = {**cli_env(ct_home), "CLOUDTRAIN_GCP_POLL": "0.01"}
    submitted = subprocess.run([*cloudtrain_argv(), "submit", "train_ddp.py", "--provider", "gcp", "--spot",
                                "--max-restarts", "2", "--detach"], cwd=project, env=env, capture_output=True,
                               text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    waited = subprocess.run([*cloudtrain_argv(), "wait", submitted.stdout.strip(), "--recover", "-o", "json"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert waited.returncode == 0, waited.stderr
    final = json.loads(waited.stdout)
    assert final["state"] == "succeeded" and final["recovery"]["restarts"] == 2
    assert waited.stderr.count("ended preempted; resubmitted as gcp://test-project/us-central1/") == 2
    assert len(vertex.jobs) == 3


def test_missing_and_expired_credentials_are_clear(vertex: VertexFake, project: Path, ct_home: Path,
                                                   tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(ct_home).items() if k not in ("CLOUDTRAIN_VERTEX_ENDPOINT",
                                                                  "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(tmp_path / "none"))
    result = subprocess.run([*cloudtrain_argv(), "status", "gcp://test-project/us-central1/123"], cwd=project,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "no Google credentials" in result.stderr and "gcloud auth application-default login" in result.stderr
    assert "Traceback" not in result.stderr

    # user credentials whose access token expired and whose refresh token was revoked: the service answers 401,
    # google-auth tries to refresh, the token endpoint refuses
    from google.oauth2.credentials import Credentials

    expired = Credentials(token="expired", refresh_token="revoked", token_uri=f"{vertex.url}/token", client_id="c",
                          client_secret="s")
    provider = VertexProvider(endpoint=f"{vertex.url}/expired", credentials=expired)
    with pytest.raises(CredentialsError, match="expired or revoked") as info:
        provider.describe(JobHandle("gcp", "123", ("test-project", "us-central1")))
    assert "gcloud auth application-default login" in str(info.value) and info.value.exit_code == 2


def test_submit_without_a_project_is_refused_before_anything_is_staged(vertex: VertexFake, project: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDTRAIN_GCP_PROJECT")
    for key in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(UserError, match=r"providers\.gcp\.project") as info:
        Job(script="train_ddp.py", source_dir=str(project)).submit("gcp")
    assert info.value.exit_code == 2 and vertex.calls == []


@pytest.mark.slow
def test_the_plan_runs_under_the_vertex_contract(vertex: VertexFake, project: Path, tmp_path: Path) -> None:
    """Submit for real (staging in the GCS emulator), then play Vertex: mount the bucket at /gcs (here: copy the
    staged prefix the command names into a local folder), give each replica of the two worker pools its CLUSTER_SPEC,
    and start each pool's container command + args with its env. The job trains and checkpoints to GCS."""
    ckpt = f"gs://{BUCKET}/contract-ckpt/{os.urandom(4).hex()}"
    run = Job(script="train_ddp.py", source_dir=str(project), nodes=2, procs_per_node=1, checkpoint={"uri": ckpt},
              args=["--epochs", "1", "--checkpoint-every", "8"]).submit("gcp")
    job = vertex.received[run.handle.job_id]  # as the client serialised it and the service received it
    pools = job["jobSpec"]["workerPoolSpecs"]
    port = free_port()
    cluster = {f"workerpool{i}": [f"workerpool{i}-{r}:2222" for r in range(int(p["replicaCount"]))]
               for i, p in enumerate(pools)}
    procs = []
    for pool_index, pool in enumerate(pools):
        for replica in range(int(pool["replicaCount"])):
            host = tmp_path / f"workerpool{pool_index}-{replica}"
            container = pool["containerSpec"]
            mounted = container["command"][1].rsplit("/", 1)[0]  # /gcs/<bucket>/<prefix>
            prefix = "gs://" + mounted.removeprefix("/gcs/")
            local = host / "gcs" / mounted.removeprefix("/gcs/")
            store = storage.store_for(prefix)
            for uri in store.list(prefix):
                store.get_file(uri, local / uri.rsplit("/", 1)[1])

            def here(arg: str, host: Path = host) -> str:
                return arg.replace("/gcs/", f"{host}/gcs/").replace(rq.WORKDIR, f"{host}/work")

            task = {"type": f"workerpool{pool_index}", "index": replica}
            env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]},
                   "CLUSTER_SPEC": json.dumps({"cluster": cluster, "task": task, "environment": "cloud"}),
                   "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                   "CLOUDTRAIN_MASTER_OVERRIDE": f"127.0.0.1:{port}"}
            argv = [sys.executable if a == "python" else here(a) for a in container["command"]]
            procs.append(subprocess.Popen([*argv, *[here(a) for a in container["args"]]], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "node 0/2 on vertex: 1 processes, rendezvous static" in outputs[0]
    assert "node 1/2 on vertex: 1 processes, rendezvous static" in outputs[1]
    assert [c.step for c in checkpoint_store.list_complete(ckpt)] == [24, 32]
