"""The Azure ML provider: plans checked offline against azure-ai-ml's schema and loaded by its own load_job, and
submit -> status -> logs -> cancel -> list -> recovery through the real MLClient against a local fake of the
workspace APIs (tests/fakes/azureml.py), with code uploads as real blob traffic to Azurite."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cloudtrain.cli.render import plan_text
from cloudtrain.errors import SpecError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState, JobStatus
from cloudtrain.jobs.recovery import load as load_recovery
from cloudtrain.providers.azure.schema import job_errors
from cloudtrain.providers.azure.status import NATIVE_STATES
from cloudtrain.sdk import Job, Run
from tests.azure_sdk import assert_rest_body_is_the_sdks, sdk_rejects
from tests.clouds import WORKSPACE, azure_project, spec_file
from tests.conftest import cli_env, wait_for
from tests.emulators import BUCKET, free_port
from tests.fakes.azureml import PREEMPTED, AzureMLFake


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return azure_project(tmp_path)


# -- plans: offline, validated by the SDK's own schema ------------------------------------------------


MATRIX = [
    # nodes, accelerator, compute cluster, strategy, spot, extra spec fields
    (1, None, None, "ddp", False, {}),
    (4, "A100:8", None, "fsdp", True, {}),
    (2, "V100:1", "gpu-cluster", "ddp", True, {}),
    (4, "H100:8", None, "ddp", False, {"image": {"uri": "myregistry.azurecr.io/train:1"}}),
    (1, "A100:8", "a100s", "fsdp", False, {"image": {"torch_version": "2.0"}}),
    (2, None, None, "ddp", True, {"inputs": {"train": "abfss://data@acct.dfs.core.windows.net/train/"}}),
]


@pytest.mark.parametrize(("nodes", "accel", "compute", "strategy", "spot", "extra"), MATRIX)
def test_plan_matrix_loads_with_azure_ml_schema(project: Path, nodes: int, accel: str | None, compute: str | None,
                                               strategy: str, spot: bool, extra: dict) -> None:
    options = {"compute": compute} if compute else {}
    with Job(script="train_ddp.py", source_dir=str(project), nodes=nodes, accelerator=accel, strategy=strategy,
             spot=spot, max_restarts=3, env={"HF_TOKEN": "hf_secretsecretsecret123"},
             providers={"azure": options}, **extra).plan("azure") as plan:
        job, rest = plan.request["job"], plan.request["rest"]["properties"]
        assert job_errors(job) == []  # the offline check, from the schema snapshot
        assert sdk_rejects(job, plan.package.path) is None  # azure-ai-ml's own load_job agrees
        assert_rest_body_is_the_sdks(job, plan.package.path)  # and builds the request the plan shows
        assert job["distribution"] == {"type": "pytorch", "process_count_per_instance": 1}
        assert rest["distribution"] == {"processCountPerInstance": 1, "distributionType": "PyTorch"}
        assert job["resources"]["instance_count"] == rest["resources"]["instanceCount"] == nodes
        if compute:
            assert job["compute"] == f"azureml:{compute}" and "instance_type" not in job["resources"]
        else:
            expected = {None: "Standard_DS3_v2", "A100:8": "Standard_ND96asr_v4",
                        "H100:8": "Standard_ND96isr_H100_v5"}[accel]
            assert rest["resources"]["instanceType"] == expected
        assert ("queueSettings" in rest) is (spot and not compute)
        assert job["environment_variables"]["CLOUDTRAIN_NNODES"] == str(nodes)
        assert job["tags"]["cloudtrain.max_restarts"] == "3"
        argv = shlex.split(job["command"])
        assert argv[:2] == ["python", "bootstrap.py"] and argv[argv.index("--bundle") + 1] == "bundle.tar.gz"
        if "image" in extra and "uri" in extra["image"]:
            assert job["environment"] == {"image": extra["image"]["uri"]}
        elif "image" in extra:
            assert "acpt-pytorch-2.0" in job["environment"]
        if "inputs" in extra:
            assert "--env=CLOUDTRAIN_INPUT_TRAIN=${{inputs.train}}" in argv
            assert rest["inputs"]["train"]["jobInputType"] == "uri_folder"
        assert job["code"] == rest["codeId"] == "./code"  # beside the YAML: written by submit or --export only
        for node in plan.nodes:
            line = node.torchrun
            assert line[line.index("--node-rank") + 1] == str(node.rank)
            assert line[line.index("--nnodes") + 1] == str(nodes)
        assert "hf_secretsecretsecret123" not in json.dumps(plan.to_dict())


def test_a_named_cluster_without_accelerator_says_the_process_count_is_only_known_on_the_node(
        project: Path) -> None:
    """Issue 16: the plan derived 1 process per node while each node starts one per visible GPU."""
    with Job(script="train_ddp.py", source_dir=str(project), nodes=2,
             providers={"azure": {"compute": "gpu-cluster"}}).plan("azure") as plan:
        text = plan_text(plan)
        assert all(n.torchrun[n.torchrun.index("--nproc-per-node") + 1] == "<one per GPU>" for n in plan.nodes)
        assert "--nproc-per-node auto" in plan.request["job"]["command"]  # what the node is told: count your GPUs
    assert "only known on the node" in text and "VM size of cluster 'gpu-cluster' is not known offline" in text
    with Job(script="train_ddp.py", source_dir=str(project), nodes=2, accelerator="V100:4",
             providers={"azure": {"compute": "gpu-cluster"}}).plan("azure") as plan:
        assert plan.nproc_per_node == 4  # an accelerator in the spec says how many


def test_plan_writes_nothing_and_shows_no_local_temp_path(project: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: an Azure plan said "staged at /tmp/cloudtrain-code-..." and wrote that folder and a YAML."""
    import tempfile

    from cloudtrain.home.paths import temp_dir

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    with Job(script="train_ddp.py", source_dir=str(project), spot=True).plan("azure") as plan:
        made = sorted(p.name for p in temp_dir().iterdir())
        text = plan_text(plan)
    assert not list(scratch.iterdir())  # nothing in the system's temp folder
    assert len(made) == 1 and made[0].startswith("cloudtrain-bundle-")  # the package itself, as on every provider
    assert str(scratch) not in text and "cloudtrain-code-" not in text and "/tmp/cloudtrain-" not in text
    assert "staged at    the workspace's default datastore" in text


@pytest.mark.parametrize(("fields", "field"), [
    ({"image": {"torch_version": "1.5"}}, "image.torch_version"),
    ({"inputs": {"train": "s3://bucket/data"}}, "inputs.train"),
    ({"providers": {"azure": {"instance_type": "Standard_Nope"}}, "accelerator": None}, None),
])
def test_bad_plans_name_the_field(project: Path, fields: dict, field: str | None) -> None:
    job = Job(script="train_ddp.py", source_dir=str(project), **fields)
    if field is None:  # an unknown VM size is Azure's to judge: the plan still shows it
        with job.plan("azure") as plan:
            assert plan.request["job"]["resources"]["instance_type"] == "Standard_Nope"
        return
    with pytest.raises(SpecError) as info:
        job.plan("azure")
    assert info.value.field == field and info.value.remedy


def test_the_native_states_are_every_status_of_the_rest_api() -> None:
    """What each status means is the conformance suite's (TestAzure): here, that the statuses it maps are Azure ML's
    whole vocabulary, as the REST API's JobStatus enum in azure-ai-ml names it."""
    from azure.ai.ml._restclient.arm_ml_service.models import JobStatus as RestStatus

    assert set(NATIVE_STATES) == {status.value for status in RestStatus}


# -- against the fake workspace and Azurite ----------------------------------------------------------


def test_cli_submit_status_logs_cancel_list(azure: AzureMLFake, project: Path, ct_home: Path) -> None:
    spec_file(project, nodes=2, accelerator="A100:1", spot=True)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=120)

    submitted = cli("submit", "--provider", "azure", "--detach")
    assert submitted.returncode == 0, submitted.stderr
    assert "experimental" not in submitted.stderr  # azure-ai-ml's notice on queue_settings (spot) is not the user's
    handle = submitted.stdout.strip()
    name = JobHandle.parse(handle).job_id
    assert handle == f"azure://sub-1/rg-1/ws-1/{name}"
    sent = azure.jobs[name]["properties"]
    assert sent["codeId"].startswith("/subscriptions/sub-1/") and "/codes/" in sent["codeId"]  # uploaded, then used
    assert sent["queueSettings"] == {"jobTier": "Spot"} and sent["resources"]["instanceCount"] == 2
    assert azure.uploads == 1
    blobs = [b.name for b in azure.container.list_blobs(name_starts_with="LocalUpload/")]
    assert sorted(b.rsplit("/", 1)[1] for b in blobs) == ["bootstrap.py", "bundle.tar.gz", "manifest.json"]

    assert cli("submit", "--provider", "azure", "--detach").returncode == 0  # same source: no second upload
    assert azure.uploads == 1, "\n".join(r[-90:] for r in azure.requests)

    shown = cli("status", handle, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["state"] == "pending" and status["max_restarts"] == 0
    azure.set_status(name, "Running")
    azure.write_log(name, 0, "[cloudtrain] node 0/2 on azureml\nstep 1 loss 2.30\n")
    azure.write_log(name, 1, "[cloudtrain] node 1/2 on azureml\n")

    follower = subprocess.Popen([sys.executable, "-m", "cloudtrain", "logs", "-f", handle], cwd=project,
                                env=cli_env(ct_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(follower.stdout or []), daemon=True)
    reader.start()
    wait_for(lambda: len(lines) >= 3, timeout=60)
    azure.write_log(name, 0, "step 2 loss 2.")  # half a line: printed once it is whole
    azure.write_log(name, 0, "10\n")
    wait_for(lambda: any("step 2" in line for line in lines), timeout=30)

    cancelled = cli("cancel", handle, "-o", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] in ("stopping", "cancelled")
    assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
    reader.join(5)
    assert [line.rstrip("\n") for line in lines] == [
        "[node 0] [cloudtrain] node 0/2 on azureml", "[node 0] step 1 loss 2.30",
        "[node 1] [cloudtrain] node 1/2 on azureml", "[node 0] step 2 loss 2.10"]
    assert json.loads(cli("status", handle, "-o", "json").stdout)["state"] == "cancelled"

    listed = json.loads(cli("list", "--provider", "azure", "-o", "json").stdout)
    assert handle in [j["handle"] for j in listed] and len(listed) == 2


def test_preempted_twice_is_resubmitted_twice_by_a_watcher_that_survives_its_own_restart(
        azure: AzureMLFake, project: Path, ct_home: Path) -> None:
    spec_file(project, spot=True, max_restarts=2)
    env = cli_env(ct_home)
    submitted = subprocess.run([sys.executable, "-m", "cloudtrain", "submit", "--provider", "azure", "--detach"],
                               cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    first = JobHandle.parse(handle).job_id

    def watcher() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "cloudtrain", "wait", handle, "--recover", "-o", "json"],
                                cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    watching = watcher()
    azure.set_status(first, "Failed", PREEMPTED)
    wait_for(lambda: f"{first[:55]}-r1" in azure.jobs, timeout=60)
    watching.kill()  # the laptop closes
    watching.wait()
    restart1 = f"{first[:55]}-r1"
    assert azure.jobs[restart1]["properties"]["tags"]["cloudtrain.restart_of"] == first
    assert azure.jobs[restart1]["properties"]["codeId"] == azure.jobs[first]["properties"]["codeId"]
    azure.set_status(restart1, "Failed", PREEMPTED)  # preempted again while nobody watched

    watching = watcher()  # picks up the chain from disk: resubmits restart 1, not the first job again
    wait_for(lambda: f"{first[:55]}-r2" in azure.jobs, timeout=60)
    azure.set_status(f"{first[:55]}-r2", "Completed")
    out, err = watching.communicate(timeout=60)
    assert watching.returncode == 0, err
    final = json.loads(out)
    assert final["state"] == "succeeded" and final["handle"].endswith("-r2")
    assert final["recovery"]["restarts"] == 2 and len(final["recovery"]["chain"]) == 3
    assert sorted(azure.jobs) == sorted([first, restart1, f"{first[:55]}-r2"])
    assert azure.uploads == 1  # restarts reuse the uploaded code


def test_sdk_recovery_stops_when_restarts_run_out_and_never_retries_user_failures(
        azure: AzureMLFake, project: Path, ct_home: Path) -> None:
    job = Job(script="train_ddp.py", source_dir=str(project), spot=True, max_restarts=1, providers={"azure": WORKSPACE})
    run = job.submit("azure")
    first = run.handle.job_id
    azure.set_status(first, "Failed", PREEMPTED)

    def preempt_the_resubmission() -> None:  # once it exists: a fixed 1 s timer fired before it did under load
        wait_for(lambda: f"{first[:55]}-r1" in azure.jobs, timeout=60, interval=0.05)
        azure.set_status(f"{first[:55]}-r1", "Failed", PREEMPTED)

    threading.Thread(target=preempt_the_resubmission, daemon=True).start()
    status = run.wait(timeout=60, poll=0.1, recover=True)
    assert status.state is JobState.PREEMPTED and status.recovery["restarts"] == 1
    assert run.handle.job_id == f"{first[:55]}-r1"  # the Run follows the newest submission

    failing = Job(script="train_ddp.py", source_dir=str(project), max_restarts=3, providers={"azure": WORKSPACE},
                  name="fails-in-user-code").submit("azure")
    azure.set_status(failing.handle.job_id, "Failed", "Execution failed. UserError: exit code 1")
    assert failing.wait(timeout=30, poll=0.1, recover=True).state is JobState.FAILED
    assert not any(name.startswith(failing.handle.job_id[:55] + "-r") for name in azure.jobs)
    assert load_recovery(failing.handle) is not None


def test_no_workspace_and_no_credentials_are_clear(project: Path, ct_home: Path, tmp_path: Path) -> None:
    (project / "cloudtrain.yaml").write_text("script: train_ddp.py\n")
    env = {k: v for k, v in cli_env(ct_home).items() if not k.startswith("AZURE_") and k != "CLOUDTRAIN_AZURE_ENDPOINT"}
    result = subprocess.run([sys.executable, "-m", "cloudtrain", "submit", "--provider", "azure"], cwd=project,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "providers.azure.subscription_id" in result.stderr
    assert "config.json" in result.stderr and "Traceback" not in result.stderr

    status = subprocess.run([sys.executable, "-m", "cloudtrain", "status", "azure://sub/rg/ws/some-job"],
                            cwd=project, env={**env, "HOME": str(tmp_path), "AZURE_CONFIG_DIR": str(tmp_path / "az"),
                                              "IDENTITY_ENDPOINT": "", "MSI_ENDPOINT": ""},
                            capture_output=True, text=True, timeout=180)
    assert status.returncode == 2, status.stderr
    assert "az login" in status.stderr and "Traceback" not in status.stderr


def start_node(azure: AzureMLFake, job_name: str, rank: int, nnodes: int, port: int, root: Path,
               inputs: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Play Azure ML for one node of a job: download the job's code asset into a working folder, substitute
    ${{inputs.*}} in the command as the service does, and start it with the job's environment variables plus what
    PyTorchDistribution sets per node (MASTER_ADDR, MASTER_PORT, NODE_RANK, WORLD_SIZE = one process per node)."""
    sent = azure.jobs[job_name]["properties"]
    code = next(c for c in azure.codes.values() if c["id"] == sent["codeId"])
    prefix = code["properties"]["codeUri"].split(f"/{azure.container.container_name}/", 1)[1]
    workdir = root / f"{job_name}-node-{rank}" / "code"
    for blob in azure.container.list_blobs(name_starts_with=prefix + "/"):
        target = workdir / blob.name[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(azure.container.download_blob(blob.name).readall())
    command = sent["command"]
    for name, path in (inputs or {}).items():
        command = command.replace(f"${{{{inputs.{name}}}}}", path)
    command = command.replace("/tmp/cloudtrain", str(root / f"{job_name}-node-{rank}" / "work"))
    env = {**os.environ, **sent["environmentVariables"], "AZUREML_RUN_ID": job_name, "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "NODE_RANK": str(rank), "WORLD_SIZE": str(nnodes), "RANK": str(rank),
           "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable if a == "python" else a for a in shlex.split(command)]
    return subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_the_plan_runs_under_the_azure_ml_contract(azure: AzureMLFake, project: Path, tmp_path: Path) -> None:
    """Submit for real (code uploaded to Azurite), then run both nodes the way Azure ML starts them."""
    data = tmp_path / "mounted-input"
    data.mkdir()
    run = Job(script="show_input.py", source_dir=str(project), nodes=2, procs_per_node=2,
              inputs={"train": "abfss://data@acct.dfs.core.windows.net/train/"},
              providers={"azure": WORKSPACE}).submit("azure")
    port = free_port()
    procs = [start_node(azure, run.handle.job_id, rank, 2, port, tmp_path, {"train": str(data)}) for rank in (0, 1)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "node 0/2 on azureml: 2 processes, rendezvous static" in outputs[0]
    assert "node 1/2 on azureml: 2 processes, rendezvous static" in outputs[1]
    for rank in range(4):
        assert f"rank {rank}/4 input={data}" in outputs[0] + outputs[1]
    assert Run(run.handle).status().state is JobState.PENDING  # the fake's job itself never ran


@pytest.mark.slow
def test_a_job_preempted_twice_resumes_from_the_checkpoint_store_and_completes(
        azure: AzureMLFake, project: Path, tmp_path: Path) -> None:
    """Real training under the Azure ML contract, checkpointing to Azurite: SIGTERM (the platform's pre-emption)
    ends the job with a final checkpoint; Azure reports it Failed/PreemptionError; cloudtrain's recovery resubmits a
    copy, whose node resumes from the checkpoint store. Twice; the third run completes the training."""
    from cloudtrain import storage
    from cloudtrain.checkpoint import store as checkpoint_store

    ckpt = storage.join(f"az://{BUCKET}", f"azure-recovery-{os.urandom(4).hex()}")
    run = Job(script="train_ddp.py", source_dir=str(project), procs_per_node=2, spot=True, max_restarts=2,
              checkpoint={"uri": ckpt}, providers={"azure": WORKSPACE},
              args=["--epochs", "2", "--checkpoint-every", "8", "--step-sleep", "0.15"]).submit("azure")
    outcome: list[JobStatus] = []
    watcher = threading.Thread(target=lambda: outcome.append(run.wait(timeout=300, poll=0.1, recover=True)))
    watcher.start()
    names = [run.handle.job_id, f"{run.handle.job_id[:55]}-r1", f"{run.handle.job_id[:55]}-r2"]
    resumed = []
    for attempt, name in enumerate(names):
        wait_for(lambda name=name: name in azure.jobs, timeout=60)
        azure.set_status(name, "Running")
        node = start_node(azure, name, 0, 1, free_port(), tmp_path)
        lines: list[str] = []
        reader = threading.Thread(target=lambda node=node, lines=lines: lines.extend(node.stdout or []))
        reader.start()
        if attempt < 2:  # pre-empted once it has published a checkpoint of its own: its first. The publish line
            # comes after the upload, late on a crowded CI machine (run 2 once finished all 32 steps of 1 epoch before
            # its SIGTERM): 2 epochs (64 steps) leave room for it
            wait_for(lambda lines=lines: any(re.search(r"checkpoint step \d+ published", x) for x in lines),
                     timeout=120)
            os.killpg(node.pid, signal.SIGTERM)
            assert node.wait(timeout=90) == 143
            reader.join(10)
            azure.set_status(name, "Failed", PREEMPTED)
        else:
            assert node.wait(timeout=180) == 0, "".join(lines)[-3000:]
            reader.join(10)
            azure.set_status(name, "Completed")
        found = [re.search(r"resumed from step (\d+)", x) for x in lines]
        resumed.append(next((int(m.group(1)) for m in found if m), 0))
    watcher.join(60)
    assert outcome and outcome[0].state is JobState.SUCCEEDED and outcome[0].handle.job_id == names[2]
    assert resumed[0] == 0 and 0 < resumed[1] < resumed[2] < 64, resumed  # each run picked up where the last stopped
    assert [c.step for c in checkpoint_store.list_complete(ckpt)][-1] == 64  # the final state is in the store
