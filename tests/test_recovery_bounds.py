"""Recovery that cannot loop (issue 31.3): status calls that fail in a way that passes never count as a preemption,
and a time budget ends recovery with a clear message. The real Vertex client (REST transport) talks to the local
fake of customJobs through a fault-injecting proxy (tests/faultproxy.py): 503s, 429 RESOURCE_EXHAUSTED throttling,
replies held past the client's timeout, connections reset before the request arrives."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.backoff import Backoff
from cloudtrain.job_types import JobState
from cloudtrain.jobs.recovery import RecoveryBudgetSpent, wait_with_recovery
from cloudtrain.providers.gcp.provider import VertexProvider
from cloudtrain.sdk import Job
from tests.conftest import cli_env
from tests.emulators import BUCKET, ensure
from tests.fakes.vertex import VertexFake
from tests.faultproxy import FaultPlan, FaultProxy, Request

STATUS_GET = re.compile(r"^/v1/projects/[^/]+/locations/[^/]+/customJobs/\d+$")
MIXED = ("http_503", "http_429", "slow", "http_500", "reset_before")


@pytest.fixture
def vertex(emulators, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> Iterator[tuple[VertexFake, FaultProxy]]:
    ensure("gs", emulators, tmp_path_factory.getbasetemp(), monkeypatch)
    fake = VertexFake()
    proxy = FaultProxy(int(fake.url.rsplit(":", 1)[1]), "gs", FaultPlan(rate=0.0, delay=0.6)).start()
    for key, value in {"CLOUDTRAIN_VERTEX_ENDPOINT": f"http://127.0.0.1:{proxy.port}",
                       "CLOUDTRAIN_GCP_LOGGING_ENDPOINT": fake.url, "CLOUDTRAIN_GCP_PROJECT": "test-project",
                       "CLOUDTRAIN_GCP_REGION": "us-central1", "CLOUDTRAIN_GCP_BUCKET": BUCKET,
                       "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud")}.items():
        monkeypatch.setenv(key, value)
    yield fake, proxy
    proxy.stop()
    fake.close()


def spread(count: int) -> tuple[list[int], object]:
    """A predicate that fails two status reads out of three until ``count`` failed: bursts of failures between
    answers, so the job moves on while its status keeps failing."""
    seen, failed = [0], [0]

    def predicate(request: Request) -> bool:
        if request.method != "GET" or not STATUS_GET.match(request.target.split("?")[0]):
            return False
        seen[0] += 1
        if failed[0] < count and seen[0] % 3:
            failed[0] += 1
            return True
        return False

    return failed, predicate


def test_25_status_failures_against_a_healthy_job_resubmit_nothing(vertex: tuple[VertexFake, FaultProxy],
                                                                    project: Path, ct_home: Path) -> None:
    fake, proxy = vertex
    fake.scripts = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", *["JOB_STATE_RUNNING"] * 25, "JOB_STATE_SUCCEEDED"]]
    run = Job(script="train_ddp.py", source_dir=str(project), nodes=2, spot=True, max_restarts=3,
              checkpoint={"uri": f"gs://{BUCKET}/ckpt-bounds"}).submit("gcp")
    provider = VertexProvider()
    provider.status_timeout = 0.3  # a reply held 0.6 s ("slow") is a timeout to the client
    failed, predicate = spread(25)
    said: list[str] = []
    with proxy.fail_matching(predicate, kind=MIXED):  # type: ignore[arg-type]
        status = wait_with_recovery(provider, run.handle, poll=0.01, log=said.append,
                                    backoff=Backoff(base=0.01, cap=0.05, rng=random.Random(0)))
    assert failed[0] == 25 and proxy.faults == 25
    assert {k for k in proxy.injected} == {"http_503", "http_429", "slow", "http_500", "reset_before"}
    assert status.state is JobState.SUCCEEDED  # the job's real end
    assert status.recovery is not None and status.recovery["restarts"] == 0
    assert fake.calls.count("create") == 1 and len(fake.jobs) == 1  # nothing resubmitted
    assert any("not a preemption" in line for line in said), said
    assert not any("resubmitted" in line for line in said)


def test_time_budget_runs_out_and_says_so(vertex: tuple[VertexFake, FaultProxy], project: Path,
                                          ct_home: Path) -> None:
    fake, _proxy = vertex
    # preempted once; the resubmission never gets capacity (stays queued)
    fake.scripts = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "PREEMPTED"]]
    run = Job(script="train_ddp.py", source_dir=str(project), spot=True, max_restarts=5,
              checkpoint={"uri": f"gs://{BUCKET}/ckpt-budget"}).submit("gcp")
    with pytest.raises(RecoveryBudgetSpent, match=r"max_recovery 1s is spent"):
        wait_with_recovery(VertexProvider(), run.handle, poll=0.05, max_recovery=1.0, log=lambda _m: None)
    assert len(fake.jobs) == 2  # one resubmission, then the budget ended recovery

    # the CLI says the same and exits 1, without a traceback; the chain is kept
    env = {**cli_env(ct_home), "CLOUDTRAIN_GCP_POLL": "0.05"}
    waited = subprocess.run([sys.executable, "-m", "cloudtrain", "wait", str(run.handle), "--recover",
                             "--max-recovery", "1s"], cwd=project, env=env, capture_output=True, text=True,
                            timeout=120)
    assert waited.returncode == 1, waited.stderr
    assert "recovery gave up: max_recovery 1s is spent" in waited.stderr
    newest = sorted(fake.jobs)[-1]
    assert f"{newest} is left as it is" in waited.stderr and "Traceback" not in waited.stderr
    assert len(fake.jobs) == 2  # the watcher picked up the same chain: no second resubmission
