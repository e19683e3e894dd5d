"""Issue 51: a state event is dated when the platform says the job moved (``JobStatus.state_since``), not when a
status call looked: SageMaker's secondary status transition, Vertex's startTime/updateTime, a Kubernetes condition's
lastTransitionTime, Slurm's StartTime; a time that is not sane (garbage, in the future, before the last event the home
recorded) is not taken and the move is dated when it was seen. Through each provider's fake at its boundary."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cloudtrain.handles import JobHandle
from cloudtrain.home import timeline
from cloudtrain.job_types import JobState, JobStatus

if TYPE_CHECKING:
    from tests.fakes.kubernetes import FakeKube
    from tests.fakes.sagemaker import SageMakerFront
    from tests.fakes.vertex import VertexFake

LATE = 30.0  # the platform moved this long before the poll that sees it


def submitted_ago(handle: Any, seconds: float) -> None:
    """The job was submitted ``seconds`` ago: the home's own events of it moved back so."""
    file = timeline.path(str(handle))
    events = [json.loads(line) for line in file.read_text().splitlines()]
    file.write_text("".join(json.dumps({**e, "t": e["t"] - seconds}) + "\n" for e in events))


def last_state(handle: Any) -> dict[str, Any]:
    return [e for e in timeline.own_events(str(handle))[0] if e["e"] == "state"][-1]


def seen(handle: Any, poll: Any) -> tuple[Any, dict[str, Any], float, float]:
    """``poll()`` (a describe), and the state event it recorded with the times around it."""
    before = time.time()
    status = poll()
    return status, last_state(handle), before, time.time()


def assert_dated(event: dict[str, Any], when: float, before: float) -> None:
    assert event["t"] == pytest.approx(when, abs=0.002), (event, when)
    assert event["seen_at"] >= before >= event["t"] + LATE - 1  # when it was seen stays beside it


def assert_seen(event: dict[str, Any], before: float, after: float) -> None:
    assert before - 0.002 <= event["t"] <= after + 0.002 and "seen_at" not in event, event


# -- the rule, on statuses made here ----------------------------------------------------------------------------

@pytest.mark.parametrize("since", ["2026-12-07T10:00:00Z", math.nan, math.inf, True, 12.0, 3600.0, None],
                         ids=["text", "nan", "inf", "bool", "1970", "an-hour-ahead", "none"])
def test_a_platform_time_that_is_not_sane_is_not_taken(ct_home: Path, since: Any) -> None:
    handle = JobHandle("gcp", "1", ("p", "r"))
    timeline.record(str(handle), "submitted", time.time() - 600, handle=str(handle))
    when = time.time() + since if since == 3600.0 else since
    status = JobStatus(handle, "j", JobState.RUNNING, "running", state_since=when)
    _, event, before, after = seen(handle, lambda: timeline.observe(status))
    assert_seen(event, before, after)


def test_a_platform_time_before_the_homes_last_event_or_a_little_ahead_is_when_it_was_seen(ct_home: Path) -> None:
    handle = JobHandle("gcp", "2", ("p", "r"))
    timeline.record(str(handle), "submitted", time.time() - 10, handle=str(handle))
    _, event, before, after = seen(handle, lambda: timeline.observe(
        JobStatus(handle, "j", JobState.PENDING, "queued", state_since=time.time() - 60)))  # before it was submitted
    assert_seen(event, before, after)
    _, event, before, after = seen(handle, lambda: timeline.observe(  # a platform clock 100 s ahead: within the skew
        JobStatus(handle, "j", JobState.RUNNING, "running", state_since=time.time() + 100)))
    assert before - 0.002 <= event["t"] == event["seen_at"] <= after + 0.002
    assert [e["e"] for e in timeline.own_events(str(handle))[0]] == ["submitted", "state", "state"]


def test_status_json_has_state_since_only_where_the_platform_says_it() -> None:
    handle = JobHandle("gcp", "3", ("p", "r"))
    said = list(JobStatus(handle, "j", JobState.RUNNING, started_at=1.8e9, state_since=1.8e9).to_dict())
    assert said[:8] == ["handle", "name", "state", "message", "created_at", "started_at", "ended_at", "state_since"]
    assert "state_since" not in JobStatus(handle, "j", JobState.RUNNING).to_dict()


# -- each platform's own time, through its fake ---------------------------------------------------------------------

@pytest.mark.slow
def test_sagemaker_dates_a_state_at_its_secondary_status_transition(aws: SageMakerFront, project: Path,
                                                                    ct_home: Path) -> None:
    from cloudtrain.providers.aws.provider import SageMakerProvider
    from cloudtrain.sdk import Job, plan_job

    provider = SageMakerProvider()
    with plan_job(Job(script="train_ddp.py", source_dir=str(project), spot=True).spec, provider,
                  progress=False) as plan:
        handle = provider.submit(plan)
    submitted_ago(handle, 600)
    training = time.time() - LATE
    aws.set_status(handle.job_id, "InProgress", "Training", at=training)
    status, event, before, _ = seen(handle, lambda: provider.describe(handle))
    assert status.state is JobState.RUNNING and status.state_since == pytest.approx(training, abs=0.002)
    assert event["platform"]["secondary_status"] == "Training"
    assert_dated(event, training, before)
    aws.set_status(handle.job_id, "InProgress", "Interrupted", at=time.time() + 3600)  # a clock an hour ahead
    _, event, before, after = seen(handle, lambda: provider.describe(handle))
    assert event["platform"]["secondary_status"] == "Interrupted"
    assert_seen(event, before, after)
    aws.set_status(handle.job_id, "InProgress", "Training", at=training - 1)  # before the home's last event
    _, event, before, after = seen(handle, lambda: provider.describe(handle))
    assert_seen(event, before, after)


@pytest.mark.slow
def test_vertex_dates_a_state_at_its_update_and_start_times(vertex: VertexFake, project: Path, ct_home: Path) -> None:
    from cloudtrain.providers.gcp.provider import VertexProvider
    from cloudtrain.sdk import Job, plan_job

    provider = VertexProvider()
    with plan_job(Job(script="train_ddp.py", source_dir=str(project), spot=True).spec, provider,
                  progress=False) as plan:
        handle = provider.submit(plan)
    submitted_ago(handle, 600)
    pending, running = time.time() - LATE - 10, time.time() - LATE
    vertex.set_state(handle.job_id, "JOB_STATE_PENDING", at=pending)
    status, event, before, _ = seen(handle, lambda: provider.describe(handle))
    assert (status.state, event["platform"]["vertex_state"]) == (JobState.PENDING, "JOB_STATE_PENDING")
    assert_dated(event, pending, before)
    vertex.set_state(handle.job_id, "JOB_STATE_RUNNING", at=running)
    status, event, before, _ = seen(handle, lambda: provider.describe(handle))
    assert status.state is JobState.RUNNING and status.started_at == status.state_since
    assert_dated(event, running, before)
    vertex.set_state(handle.job_id, "JOB_STATE_PENDING", at=time.time() + 3600)  # restarting, by a clock ahead
    status, event, before, after = seen(handle, lambda: provider.describe(handle))
    assert status.state is JobState.PENDING and "restarting" in status.message
    assert_seen(event, before, after)


@pytest.mark.slow
def test_kubernetes_dates_a_state_at_its_conditions_transition(kube: FakeKube, tmp_path: Path, ct_home: Path) -> None:
    from cloudtrain.sdk import plan_job
    from cloudtrain.testing.fixtures import ddp_project
    from tests.fakes.kubernetes import STAGED, job, provider

    p = provider()
    spec = job(ddp_project(tmp_path), providers={"kubernetes": {**STAGED["providers"]["kubernetes"],
                                                                "api": "pytorchjob"}}).spec
    with plan_job(spec, p, progress=False) as plan:
        handle = p.submit(plan)
    submitted_ago(handle, 600)
    created, running = int(time.time() - LATE - 10), int(time.time() - LATE)  # the API server's times are seconds
    kube.set_condition(handle.job_id, "Created", "PyTorchJobCreated", at=created)
    status, event, before, _ = seen(handle, lambda: p.describe(handle))
    assert (status.state, event["platform"]["condition"]) == (JobState.PENDING, "Created")
    assert_dated(event, created, before)
    kube.add_pod(handle.job_id, 0, "x\n")
    kube.set_condition(handle.job_id, "Running", "PyTorchJobRunning", at=running)
    status, event, before, _ = seen(handle, lambda: p.describe(handle))
    assert status.state is JobState.RUNNING
    assert_dated(event, running, before)
    kube.set_condition(handle.job_id, "Restarting", "PyTorchJobRestarting", at=time.time() + 3600)
    status, event, before, after = seen(handle, lambda: p.describe(handle))
    assert (status.state, event["platform"]["condition"]) == (JobState.PENDING, "Restarting")
    assert_seen(event, before, after)
    kube.set_condition(handle.job_id, "Running", "PyTorchJobRunning", at="not a time")
    status, event, before, after = seen(handle, lambda: p.describe(handle))
    assert status.state is JobState.RUNNING and status.state_since is None
    assert_seen(event, before, after)


def test_slurm_dates_running_at_its_start_and_an_end_at_its_end(ct_home: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's commands answered as slurmctld would (``scontrol --oneliner show job``: local times, in seconds)."""
    from cloudtrain.providers.slurm import clients
    from cloudtrain.providers.slurm.provider import SlurmProvider

    shown: dict[str, str] = {}

    def run(_self: Any, argv: list[str], check: bool = True, data: bytes | None = None,
            binary: bool = False) -> subprocess.CompletedProcess[str]:
        out = {"squeue": "4242\n", "scontrol": " ".join(f"{k}={v}" for k, v in shown.items()) + "\n"}
        return subprocess.CompletedProcess(argv, 0, out.get(argv[0], ""), "")

    def local(when: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))

    monkeypatch.setattr(clients.Commands, "run", run)
    provider = SlurmProvider()
    handle = provider.handle("train-20261207-120000-abcd")
    timeline.record(str(handle), "submitted", time.time() - 600, handle=str(handle))
    started = int(time.time() - LATE)
    shown.update(JobId="4242", JobName=handle.job_id, JobState="RUNNING", Reason="None", Restarts="0",
                 SubmitTime=local(started - 60), StartTime=local(started), EndTime="Unknown", ExitCode="0:0",
                 WorkDir=str(tmp_path / "job"))
    status, event, before, _ = seen(handle, lambda: provider.describe(handle))
    assert status.state is JobState.RUNNING and status.state_since == started
    assert_dated(event, started, before)
    shown.update(JobState="PENDING", Reason="BeginTime", Restarts="1", StartTime=local(time.time() + 120))
    status, event, before, after = seen(handle, lambda: provider.describe(handle))  # the start slurmctld expects
    assert status.state is JobState.PENDING and status.state_since is None
    assert_seen(event, before, after)
    ended = int(time.time() - 2)
    shown.update(JobState="COMPLETED", Reason="None", StartTime=local(ended - 1), EndTime=local(ended))
    status = provider.describe(handle)
    assert status.state is JobState.SUCCEEDED and status.state_since == status.ended_at == ended
