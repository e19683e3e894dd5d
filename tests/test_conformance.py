"""The provider conformance suite (cloudtrain.testing), passed by every provider: the three clouds against their
fakes (SageMaker: moto plus tests/fakes/sagemaker.py; Azure ML: tests/fakes/azureml.py with Azurite; Vertex:
tests/fakes/vertex.py with the GCS emulator), local with real processes, and ``toy``: a provider from outside cloudtrain
(tests/plugin/toyprov: one folder, options of its own, a node contract of its own), registered through a real
``cloudtrain.providers`` entry point (a .dist-info written by tests/plugins.py and put on sys.path), with no line of
cloudtrain changed for it. The suite itself is cloudtrain.testing (shipped with the package, as a plugin's tests
use it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain import registry
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobState
from cloudtrain.testing import Harness, ProviderConformance
from tests import plugins
from tests.conftest import cli_env, ddp_project

toy_plugin = plugins.toy_plugin  # a fixture

# -- the harnesses: the platform's part, per provider ------------------------------------------------


class ToyHarness(Harness):
    fields = {"providers": {"toy": {"queue": "batch", "priority": 7}}}

    def __init__(self, project: Path) -> None:
        from toyprov.provider import STATES

        self.project = project
        self.provider = registry.get_provider("toy")  # found through its entry point
        self.status_table = [(native, state) for native, state in STATES.items()]
        self.native_states = tuple(STATES)

    def state_of(self, native: Any) -> JobState:
        from toyprov.provider import job_state

        return job_state(native)

    def lose_next_submit_reply(self) -> None:
        self.provider.lose_next_reply = True  # type: ignore[attr-defined]


class LocalHarness(Harness):
    def __init__(self, project: Path) -> None:
        self.project = project
        self.provider = registry.get_provider("local")
        self.status_table = [(state.value, state) for state in JobState]  # a local job's states are cloudtrain's
        self.native_states = tuple(state.value for state in JobState)

    def state_of(self, native: Any) -> JobState:
        return JobState(native)

    def lose_next_submit_reply(self) -> None:
        """No network: a submit retried is the same plan submitted again, which the suite does."""


class AwsHarness(Harness):
    status_table = [  # Interrupted, Restarting: spot capacity reclaimed, SageMaker starts the job again (not an end)
        *((("InProgress", s), JobState.PENDING) for s in ("Starting", "Pending", "LaunchingMLInstances",
                                                           "PreparingTrainingStack", "Downloading",
                                                           "DownloadingTrainingImage", "Interrupted", "Restarting")),
        *((("InProgress", s), JobState.RUNNING) for s in ("Training", "Uploading", "Updating")),
        (("Stopping", "Stopping"), JobState.STOPPING), (("Completed", "Completed"), JobState.SUCCEEDED),
        (("Failed", "Failed"), JobState.FAILED), (("Stopped", "Stopped"), JobState.CANCELLED),
        (("Stopped", "MaxWaitTimeExceeded"), JobState.PREEMPTED), (("Stopped", "MaxRuntimeExceeded"), JobState.FAILED),
        (("Deleting", ""), JobState.CANCELLED)]

    def __init__(self, project: Path, front: Any) -> None:
        from botocore.config import Config

        from cloudtrain.providers.aws.provider import SageMakerProvider
        from cloudtrain.providers.aws.status import NATIVE_STATES

        self.project, self.front, self.native_states = project, front, NATIVE_STATES
        self.provider = SageMakerProvider(client_config=Config(read_timeout=1, connect_timeout=2,
                                                               retries={"max_attempts": 3, "mode": "standard"}),
                                          log_poll=0.2)

    def state_of(self, native: Any) -> JobState:
        from cloudtrain.providers.aws.status import job_state

        return job_state(*native)[0]

    def lose_next_submit_reply(self) -> None:
        self.front.lose_next_create_reply = 2.5

    def play(self, handle: JobHandle, lines: list[str]) -> None:
        from tests.clouds import write_node_log

        write_node_log(handle.job_id, "algo-1", lines)
        self.front.set_status(handle.job_id, "Completed", "Completed")


class AzureHarness(Harness):
    fields = {"providers": {"azure": {"subscription_id": "sub-1", "resource_group": "rg-1", "workspace": "ws-1"}}}
    status_table = [  # NotResponding, Paused, Unknown: not an end
        *(((s, ""), JobState.PENDING) for s in ("NotStarted", "Starting", "Provisioning", "Preparing", "Queued",
                                                 "NotResponding", "Paused", "Unknown")),
        (("Running", ""), JobState.RUNNING), (("Finalizing", ""), JobState.RUNNING),
        (("CancelRequested", ""), JobState.STOPPING), (("Completed", ""), JobState.SUCCEEDED),
        (("Failed", ""), JobState.FAILED), (("Failed", "Execution failed. UserError: exit code 1"), JobState.FAILED),
        (("Canceled", ""), JobState.CANCELLED)]

    def __init__(self, project: Path, fake: Any) -> None:
        from cloudtrain.providers.azure.provider import AzureMLProvider
        from cloudtrain.providers.azure.status import NATIVE_STATES
        from tests.fakes.azureml import PREEMPTED

        self.project, self.fake = project, fake
        self.native_states = tuple((status, "") for status in NATIVE_STATES)
        self.provider = AzureMLProvider(log_poll=0.2)
        self.status_table = [*self.status_table, (("Failed", PREEMPTED), JobState.PREEMPTED)]

    def state_of(self, native: Any) -> JobState:
        from cloudtrain.providers.azure.status import job_state

        return job_state(*native)[0]

    def native_word(self, native: Any) -> Any:
        return native[0], ""  # the status; the error only tells a preemption from a failure

    def lose_next_submit_reply(self) -> None:
        self.fake.lose_next_job_reply = True

    def play(self, handle: JobHandle, lines: list[str]) -> None:
        self.fake.write_log(handle.job_id, 0, "".join(f"{line}\n" for line in lines))
        self.fake.set_status(handle.job_id, "Completed")

    def preempt(self, handle: JobHandle) -> None:
        from tests.fakes.azureml import PREEMPTED

        self.fake.set_status(handle.job_id, "Failed", PREEMPTED)


class GcpHarness(Harness):
    status_table = [  # (state, error, started: it ran before)
        *(((s, "", False), JobState.PENDING) for s in ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_PAUSED",
                                                       "JOB_STATE_UNSPECIFIED")),
        (("JOB_STATE_PENDING", "", True), JobState.PENDING),  # Vertex restarts it (a worker restart, a preemption)
        (("JOB_STATE_RUNNING", "", True), JobState.RUNNING), (("JOB_STATE_UPDATING", "", True), JobState.RUNNING),
        (("JOB_STATE_CANCELLING", "", True), JobState.STOPPING),
        (("JOB_STATE_SUCCEEDED", "", True), JobState.SUCCEEDED),
        (("JOB_STATE_FAILED", "exit code 1", True), JobState.FAILED),
        (("JOB_STATE_EXPIRED", "", True), JobState.FAILED),
        (("JOB_STATE_PARTIALLY_SUCCEEDED", "", True), JobState.FAILED),
        (("JOB_STATE_FAILED", "The replica workerpool1-0 was preempted", True), JobState.PREEMPTED),
        (("JOB_STATE_CANCELLED", "", True), JobState.CANCELLED)]

    def __init__(self, project: Path, fake: Any) -> None:
        from cloudtrain.providers.gcp.provider import VertexProvider
        from cloudtrain.providers.gcp.status import NATIVE_STATES
        from tests.fakes.vertex import PREEMPTED_ERROR

        self.project, self.fake = project, fake
        self.native_states = tuple((state, "", False) for state in NATIVE_STATES)
        self.provider = VertexProvider(log_poll=0.2)
        self.status_table = [*self.status_table,
                             (("JOB_STATE_FAILED", PREEMPTED_ERROR["message"], True), JobState.PREEMPTED)]

    def state_of(self, native: Any) -> JobState:
        from cloudtrain.providers.gcp.status import job_state

        return job_state(*native)[0]

    def native_word(self, native: Any) -> Any:
        return native[0], "", False  # the state; the error and the start tell a preemption or a restart

    def lose_next_submit_reply(self) -> None:
        self.fake.lose_next_create_reply = 3
        self.provider.create_timeout = 1  # type: ignore[attr-defined]

    def play(self, handle: JobHandle, lines: list[str]) -> None:
        self.fake.write_log(handle.job_id, "workerpool0-0", lines)
        self.fake.set_state(handle.job_id, "JOB_STATE_SUCCEEDED")

    def preempt(self, handle: JobHandle) -> None:
        from tests.fakes.vertex import PREEMPTED_ERROR

        self.fake.set_state(handle.job_id, "JOB_STATE_FAILED", PREEMPTED_ERROR)


class KubernetesHarness(Harness):
    fields = {"providers": {"kubernetes": {"staging": "pvc://shared/cloudtrain", "namespace": "team"}}}

    def __init__(self, project: Path, fake: Any) -> None:
        from cloudtrain.providers.kubernetes.provider import KubernetesProvider
        from cloudtrain.providers.kubernetes.status import NATIVE_STATES, TABLE

        self.project, self.fake = project, fake
        self.provider = KubernetesProvider(log_poll=0.2)
        self.status_table, self.native_states = list(TABLE), NATIVE_STATES

    def state_of(self, native: Any) -> JobState:
        from cloudtrain.providers.kubernetes.status import job_state

        return job_state(native)[0]

    def native_word(self, native: Any) -> Any:
        return type(native)(native.kind, native.condition)  # the deciding condition; the rest is what it found

    def lose_next_submit_reply(self) -> None:
        self.fake.lose_next_create_reply = True

    def play(self, handle: JobHandle, lines: list[str]) -> None:
        self.fake.add_pod(handle.job_id, 0, "".join(f"{line}\n" for line in lines))
        self.fake.set_condition(handle.job_id, "Complete", "JobSetCompleted")

    def preempt(self, handle: JobHandle) -> None:
        self.fake.add_pod(handle.job_id, 0, disrupted=True)
        self.fake.set_condition(handle.job_id, "Failed", "JobSetFailed")


# -- every provider passes the suite ----------------------------------------------------------------


class TestToy(ProviderConformance):
    @pytest.fixture
    def harness(self, toy_plugin: Path, ct_home: Path, tmp_path: Path) -> Harness:
        return ToyHarness(ddp_project(tmp_path))


class TestLocal(ProviderConformance):
    @pytest.fixture
    def harness(self, ct_home: Path, tmp_path: Path) -> Harness:
        return LocalHarness(ddp_project(tmp_path))


class TestAws(ProviderConformance):
    @pytest.fixture
    def harness(self, aws: Any, ct_home: Path, tmp_path: Path) -> Harness:
        return AwsHarness(ddp_project(tmp_path), aws)


class TestAzure(ProviderConformance):
    @pytest.fixture
    def harness(self, azure: Any, ct_home: Path, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Harness:
        project = ddp_project(tmp_path)
        # `list` finds the workspace where commands without a spec look: the project's cloudtrain.yaml
        (project / "cloudtrain.yaml").write_text(json.dumps({"script": "prints.py", **AzureHarness.fields}))
        monkeypatch.chdir(project)
        return AzureHarness(project, azure)


class TestGcp(ProviderConformance):
    @pytest.fixture
    def harness(self, vertex: Any, ct_home: Path, tmp_path: Path) -> Harness:
        return GcpHarness(ddp_project(tmp_path), vertex)


class TestKubernetes(ProviderConformance):
    @pytest.fixture
    def harness(self, kube: Any, ct_home: Path, tmp_path: Path) -> Harness:
        return KubernetesHarness(ddp_project(tmp_path), kube)



# -- the plugin, wherever the registry reaches -------------------------------------------------------


def cli(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd or home.parent,
                          env={**cli_env(home), "PYTHONPATH": os.environ["PYTHONPATH"]}, capture_output=True,
                          text=True, timeout=240)


def test_the_plugins_options_settings_and_checks_in_the_cli(toy_plugin: Path, ct_home: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond what the suite checks for every provider (test_shows_up_wherever_providers_are_listed): the toy's
    own options, settings and checks, in order after the built-ins."""
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(tmp_path / "config.yaml"))  # `config set` below writes there
    helped = cli(ct_home, "plan", "--help")
    assert "local, aws, azure, gcp, slurm, kubernetes or toy" in helped.stdout and "toybatch" in helped.stdout, \
        helped.stdout

    schema = json.loads(cli(ct_home, "schema").stdout)
    toy = schema["$defs"]["ToyOptions"]
    assert set(toy["properties"]) == {"queue", "priority"} and toy["additionalProperties"] is False
    emulate = schema["$defs"]["LocalOptions"]["properties"]["emulate"]["anyOf"][0]["enum"]
    assert emulate == ["sagemaker", "azureml", "vertex", "slurm", "kubernetes", "toybatch"]

    shown = json.loads(cli(ct_home, "config", "-p", "toy", "-o", "json").stdout)["settings"]
    assert {s["key"]: s["source"] for s in shown} == {"providers.toy.queue": "unset",
                                                       "providers.toy.priority": "default"}
    assert cli(ct_home, "config", "set", "toy.queue", "gpu-long").returncode == 0
    shown = json.loads(cli(ct_home, "config", "-p", "toy", "-o", "json").stdout)["settings"]
    assert shown[0]["value"] == "gpu-long" and shown[0]["source"].startswith("profile default")

    checks = json.loads(cli(ct_home, "doctor", "-p", "toy", "-o", "json").stdout)
    assert {(c["area"], c["name"], c["status"]) for c in checks if c["area"] == "toy"} == {
        ("toy", "spool", "ok"), ("toy", "queue", "ok")}

    project = ddp_project(tmp_path)
    bad = cli(ct_home, "plan", "train_ddp.py", "--provider", "toy", "--set", "providers.toy.priority=12", cwd=project)
    assert bad.returncode == 2 and "providers.toy.priority" in bad.stderr and "Traceback" not in bad.stderr


def test_the_registry_reads_entry_points_as_importlib_metadata_does(toy_plugin: Path) -> None:
    from importlib.metadata import entry_points

    expected = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    scanned = {name: entry.value for name, entry in registry._scan(tuple(sys.path)).items()}  # the switch aside
    assert scanned == expected and expected["toy"] == "toyprov:PROVIDER"
    assert registry.names()[-1] == "toy" and registry.declaration("toy").summary.startswith("a toy batch")


def test_a_plugin_plan_without_its_queue_is_refused_at_submit(toy_plugin: Path, ct_home: Path,
                                                              tmp_path: Path) -> None:
    from cloudtrain.errors import UserError
    from cloudtrain.sdk import Job

    project = ddp_project(tmp_path)
    job = Job(script="train_ddp.py", source_dir=str(project))
    with job.plan("toy") as plan:
        assert any("queue is not set" in note and "TOY_QUEUE" in note for note in plan.notes)
    with pytest.raises(UserError, match=r"providers\.toy\.queue") as refused:
        job.submit("toy")
    assert "TOY_QUEUE" in (refused.value.remedy or "")
    assert not (ct_home / "toy-spool").exists()  # nothing staged, nothing sent
