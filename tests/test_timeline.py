"""Issue 41.1, 41.2, 41.4: a job's timeline (client events in the home, node events in its logs), its progress and
goodput in `status` (text and -o json), and `status -o openmetrics` read back with prometheus_client's own parser.
Real local jobs (the reference DDP trainer, a rehearsed preemption) through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from subprocess import CompletedProcess
from typing import TYPE_CHECKING

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.conftest import status_json
from tests.fakes.azureml import AzureMLFake
from tests.fakes.kubernetes import FakeKube
from tests.fakes.sagemaker import SageMakerFront
from tests.fakes.vertex import VertexFake
from tests.preempted_job import READS_IT, STEPS  # READS_IT: the tests of the one preempted job, on one worker

if TYPE_CHECKING:
    from tests.preempted_job import Cli

pytestmark = pytest.mark.slow


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@READS_IT
def test_timeline_tells_the_whole_story(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    found = status_json(cli, handle)
    events = found["timeline"]["events"]
    kinds = [e["e"] for e in events]
    for kind in ("submitted", "staged", "node_started", "step", "checkpoint", "preempted", "restored",
                 "training_again", "ended"):
        assert kind in kinds, (kind, kinds)
    order = [kinds.index("submitted"), kinds.index("preempted"), kinds.index("restored"),
             kinds.index("training_again"), kinds.index("ended")]
    assert order == sorted(order), kinds
    assert [e["attempt"] for e in events if e["e"] == "node_started" and "attempt" in e] == [0, 1]
    assert [(e["rank"], e["node"]) for e in events if e["e"] == "node_started" and "node" in e] == [(0, 0), (0, 0)]
    saved = next(e for e in events if e["e"] == "checkpoint")
    assert saved["bytes"] > 0 and saved["blocked_s"] >= 0 and saved["publish_s"] >= 0 and saved["step"] % 10 == 0
    restored = next(e for e in events if e["e"] == "restored")
    assert restored["bytes"] > 0 and restored["seconds"] >= 0 and restored["step"] > 0
    assert next(e for e in events if e["e"] == "ended")["state"] == "succeeded"
    assert found["timeline"]["missing"] == 0
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)


@READS_IT
def test_progress_and_goodput_in_status(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    found = status_json(cli, handle)
    progress, good = found["progress"], found["goodput"]
    assert progress["step"] == progress["total"] == STEPS
    assert progress["source"] == "report_step" and progress["steps_per_s"] > 0 and progress["eta_s"] is None
    assert good["legs"] == 2 and good["preemptions"] == 1
    assert 0 < good["ratio"] <= 1
    assert good["kept_s"] < good["paid_s"]
    losses = good["losses_s"]
    assert losses["infrastructure"] > 0 and losses["program_startup"] > 0 and losses["checkpoint_restore"] > 0
    assert losses["checkpoint_save"] > 0
    assert good["kept_s"] + sum(v for k, v in losses.items() if k != "waiting") == pytest.approx(good["paid_s"],
                                                                                                 abs=0.01)
    text = cli("status", handle).stdout
    assert f"progress: step {STEPS}/{STEPS} (100%)" in text and f"goodput: {good['ratio']:.2f} of" in text


@READS_IT
def test_openmetrics_parse_back(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, handle, _ = preempted_job
    good = status_json(cli, handle)["goodput"]
    for args in (("status", "-o", "openmetrics"), ("status", handle, "-o", "openmetrics")):
        out = cli(*args)
        assert out.returncode == 0, out.stderr
        assert out.stdout.endswith("# EOF\n")
        parsed = families(out.stdout)
        value = {s.name: s.value for samples in parsed.values() for s in samples if s.labels.get("handle") == handle
                 and "cause" not in s.labels and "cloudtrain_job_state" not in s.labels}
        assert value["cloudtrain_job_restarts_total"] == 1 and value["cloudtrain_job_preemptions_total"] == 1
        assert value["cloudtrain_job_step"] == STEPS
        assert value["cloudtrain_job_goodput_ratio"] == pytest.approx(good["ratio"])
        assert "cloudtrain_job_checkpoint_age_seconds" not in value  # an ended job's checkpoint does not age
        states = {s.labels["cloudtrain_job_state"]: s.value for s in parsed["cloudtrain_job_state"]}
        assert states["succeeded"] == 1 and sum(states.values()) == 1
        lost = {s.labels["cause"] for s in parsed["cloudtrain_job_lost_seconds"]}
        assert {"infrastructure", "program_startup", "checkpoint_restore", "checkpoint_save"} <= lost


@READS_IT
def test_torn_event_lines_are_missing_not_errors(preempted_job: tuple[Cli, str, Path]) -> None:
    """A node killed mid-write leaves half an event line; a torn line in the home's events file too. (The shared
    job's files are put back as they were after.)"""
    cli, handle, home = preempted_job
    job_id = handle.split("://", 1)[1]
    log_file, events_file = home / "jobs" / job_id / "node-0.log", next((home / "events").glob("*.jsonl"))
    kept = {f: f.read_bytes() for f in (log_file, events_file)}
    try:
        with open(log_file, "a") as log:
            log.write('[default0]:cloudtrain-event {"e":"checkpoint","t":17958')  # no newline: the writer was killed
        with open(events_file, "a") as f:
            f.write('{"e":"state","t":1\n')
        out = cli("status", handle)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "2 event line(s) cut short or unreadable are missing" in out.stdout
        assert status_json(cli, handle)["timeline"]["missing"] == 2
        assert cli("status", handle, "-o", "openmetrics").returncode == 0
    finally:
        for f, data in kept.items():
            f.write_bytes(data)


@READS_IT
def test_unknown_handle_and_no_handle_exit_2(preempted_job: tuple[Cli, str, Path]) -> None:
    cli, _, _ = preempted_job
    for args in (("status", "local://no-such-job", "-o", "openmetrics"), ("status",)):
        out = cli(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "fix:" in out.stderr or "cloudtrain list" in out.stderr


def test_node_events_parse(tmp_path: Path) -> None:
    """Lines as the logs carry them: node and worker prefixes, a torn one, a line of another shape."""
    from cloudtrain.home.timeline import node_events
    from cloudtrain.node.events import line

    good = line("restored", step=5, bytes=10, seconds=0.5)
    found, missing = node_events([f"[node1] [default0]:{good}", "[node0] plain", "[node0] cloudtrain-event {\"e\"",
                                  'cloudtrain-event ["e", 1]', json.dumps({"e": "x"}), f"[node 2] {good}",
                                  f"[node-3] {good}", f"[algo-1] {good}", f"[workerpool1-0] {good}"])
    assert [(e["e"], e["node"], e["step"]) for e in found] == [("restored", 1, 5), ("restored", 2, 5),
                                                               ("restored", 3, 5), ("restored", "algo-1", 5),
                                                               ("restored", "workerpool1-0", 5)]
    assert missing == 2


def test_a_vertex_job_has_a_timeline_from_its_states_and_logs(vertex: VertexFake, project: Path,
                                                               ct_home: Path) -> None:
    """A cloud: the client's events (submitted, staged, the platform's states, the end) and the nodes' events out
    of the logs status fetches (Cloud Logging through the fake), each named by its replica."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.node.events import line
    from tests.conftest import cli_env

    def cli(*args: str) -> CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=120)

    out = cli("submit", "train_ddp.py", "--provider", "gcp", "--nodes", "2", "--gpus", "L4:1", "--spot", "--detach")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip()
    job_id = JobHandle.parse(handle).job_id
    assert [e["e"] for e in status_json(cli, handle)["timeline"]["events"]] == ["submitted", "staged", "state"]
    vertex.set_state(job_id, "JOB_STATE_RUNNING")
    vertex.write_log(job_id, "workerpool0-0", [line("restored", step=40, bytes=2_000_000, seconds=0.5, gbps=0.004),
                                                line("step", step=41, total=100), "step 41 loss 2.30"])
    time.sleep(0.2)
    vertex.write_log(job_id, "workerpool0-0", [line("checkpoint", step=50, bytes=10, blocked_s=0.1, publish_s=0.3),
                                                line("step", step=60, total=100)])
    found = status_json(cli, handle)
    events = found["timeline"]["events"]
    assert [e["e"] for e in events if "node" in e] == ["restored", "step", "checkpoint", "step"]
    assert {e["node"] for e in events if "node" in e} == {"workerpool0-0"}
    assert ("state", "running") in [(e["e"], e.get("state")) for e in events]
    assert found["progress"]["step"] == 60 and found["progress"]["total"] == 100
    assert found["progress"]["steps_per_s"] > 0 and found["progress"]["eta_s"] is not None
    vertex.set_state(job_id, "JOB_STATE_SUCCEEDED")
    found = status_json(cli, handle)
    assert "ended" in [e["e"] for e in found["timeline"]["events"]]
    assert found["goodput"]["legs"] == 1 and found["goodput"]["paid_s"] > 0
    metrics = families(cli("status", handle, "-o", "openmetrics").stdout)
    assert [s.value for s in metrics["cloudtrain_job_step"]] == [60]


def test_an_azure_ml_job_has_a_timeline_from_its_states_and_logs(azure: AzureMLFake, project: Path,
                                                                 ct_home: Path) -> None:
    """Azure ML: the client's events and the nodes' events out of the user logs status fetches ([node 0] ...)."""
    import yaml

    from cloudtrain.handles import JobHandle
    from cloudtrain.node.events import line
    from tests.conftest import cli_env

    workspace = {"subscription_id": "sub-1", "resource_group": "rg-1", "workspace": "ws-1"}
    (project / "cloudtrain.yaml").write_text(yaml.safe_dump({"script": "train_ddp.py", "nodes": 2, "spot": True,
                                                             "accelerator": "A100:1",
                                                             "providers": {"azure": workspace}}))

    def cli(*args: str) -> CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=120)

    out = cli("submit", "--provider", "azure", "--detach")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip()
    name = JobHandle.parse(handle).job_id
    azure.set_status(name, "Running")
    azure.write_log(name, 0, "\n".join([line("restored", step=40, bytes=2_000_000, seconds=0.5, gbps=0.004),
                                         line("step", step=41, total=100), "step 41 loss 2.30", ""]))
    azure.write_log(name, 1, line("spot_notice", platform="azure", action="Preempt") + "\n")
    azure.write_log(name, 0, 'cloudtrain-event {"e":"checkpoint","t":17')  # the node was killed mid-line
    found = status_json(cli, handle)
    events = found["timeline"]["events"]
    assert [e["e"] for e in events][:2] == ["submitted", "staged"]
    assert ("state", "running") in [(e["e"], e.get("state")) for e in events]
    assert sorted((e["e"], e["node"]) for e in events if "node" in e) == [("restored", 0), ("spot_notice", 1),
                                                                           ("step", 0)]
    assert found["progress"]["step"] == 41 and found["timeline"]["missing"] == 1


def test_events_are_masked_and_a_plain_script_reports_its_step(cli: Cli, ct_home: Path, tmp_path: Path) -> None:
    """An event holding a secret value reaches status masked, as every log line does; report_step works from a
    plain script (no Checkpointer). A kind cloudtrain's runtime does not emit from a worker is not taken from one."""
    secret = "wandb-timeline-" + "7f3a9c2e5b1d4f6a8c0e2b4d6f8a1c3e"
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "plain.py").write_text("import os\nfrom cloudtrain.node.events import emit\n"
                                   "from cloudtrain.runtime import report_step\n"
                                   "emit('step', step=2, value=os.environ['WANDB_API_KEY'])\n"
                                   "emit('note', value='x')\nreport_step(3, total=5)\n")
    out = cli("submit", str(proj / "plain.py"), "--env", f"WANDB_API_KEY={secret}")
    assert out.returncode == 0, out.stderr
    handle = next(w for w in (out.stdout + out.stderr).split() if w.startswith("local://"))
    shown = cli("status", handle, "-o", "json")
    assert shown.returncode == 0 and secret not in shown.stdout
    found = json.loads(shown.stdout)
    said = next(e for e in found["timeline"]["events"] if e["e"] == "step" and "value" in e)
    assert "****" in said["value"] and not any(e["e"] == "note" for e in found["timeline"]["events"])
    assert found["timeline"]["ignored"]["count"] == 1
    assert found["progress"]["step"] == 3 and found["progress"]["total"] == 5
    assert all(secret not in p.read_text() for p in (ct_home / "events").iterdir())


def test_an_unreadable_events_folder_is_exit_2_with_the_fix(cli: Cli, ct_home: Path) -> None:
    ct_home.mkdir(parents=True, exist_ok=True)
    (ct_home / "events").write_text("not a folder")
    out = cli("status", "-o", "openmetrics")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "events" in out.stderr and "fix:" in out.stderr


def test_goodput_counts_the_steps_redone_after_a_restore() -> None:
    """A node killed (no final save) at step 50 after a checkpoint at 40: the next leg restores 40 and trains 10
    steps again. 10 steps/s; each leg's nodes take 2 s to train, the restore 1 s, each checkpoint blocks 0.5 s."""
    from types import SimpleNamespace

    from cloudtrain.home.goodput import summarise
    from cloudtrain.job_types import JobState

    def ev(kind: str, t: float, **fields: object) -> dict:
        return {"e": kind, "t": t, **fields}

    events = [ev("submitted", 0), ev("node_started", 5, attempt=0), ev("step", 7, step=1, total=100),
              ev("checkpoint", 10.9, step=40, blocked_s=0.5), ev("step", 12, step=50, total=100),
              ev("preempted", 12, attempt=0), ev("node_started", 20, attempt=1),
              ev("restored", 22, step=40, seconds=1.0), ev("training_again", 23, step=41),
              ev("step", 29, step=100, total=100), ev("ended", 30, state="succeeded")]
    status = SimpleNamespace(state=JobState.SUCCEEDED, started_at=5, ended_at=30, created_at=0)
    g = summarise(events, status)["goodput"]
    assert g["legs"] == 2 and g["paid_s"] == 17 and g["preemptions"] == 1 and g["steps_redone"] == 10
    losses = g["losses_s"]
    assert losses["waiting"] == 5 and losses["checkpoint_restore"] == 1 and losses["checkpoint_save"] == 0.5
    # node start to the first step; the second leg less its restore (no node's own start: no infrastructure told)
    assert losses["program_startup"] == 2 + 2 and losses["infrastructure"] == 0
    rate = (49 + 59) / (5 + 6 - 0.5)  # steps over training time, less the time blocked on the checkpoint
    assert losses["wasted_progress"] == pytest.approx(10 / rate, abs=1e-3)
    assert g["kept_s"] == pytest.approx(100 / rate, abs=1e-3) and g["ratio"] == pytest.approx(100 / rate / 17,
                                                                                                abs=1e-3)


def test_goodput_counts_the_workers_load_as_restore() -> None:
    """On several nodes a node's restore leaves the shards to the ranks, which fetch them in the Checkpointer's
    load: its time (``training_again``'s ``load_s``) is restore, not start-up."""
    from types import SimpleNamespace

    from cloudtrain.home.goodput import summarise
    from cloudtrain.job_types import JobState

    events = [{"e": "submitted", "t": 0}, {"e": "node_started", "t": 5, "attempt": 0},
              {"e": "restored", "t": 6, "step": 40, "seconds": 0.2},
              {"e": "training_again", "t": 9, "step": 41, "load_s": 1.5},
              {"e": "step", "t": 14, "step": 91, "total": 91}, {"e": "ended", "t": 15, "state": "succeeded"}]
    status = SimpleNamespace(state=JobState.SUCCEEDED, started_at=5, ended_at=15, created_at=0)
    losses = summarise(events, status)["goodput"]["losses_s"]
    assert losses["checkpoint_restore"] == pytest.approx(1.7)
    assert losses["program_startup"] == pytest.approx(4 - 1.7)


def test_recovery_restarts_are_in_the_first_jobs_timeline(vertex: VertexFake, project: Path,
                                                          ct_home: Path) -> None:
    """`wait --recover` resubmits a Vertex job preempted twice: the first job's timeline names each restart and the
    job it made; each new job's timeline starts with its submission."""
    from tests.conftest import cli_env

    scripts = [["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "PREEMPTED"]] * 2 + [
        ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]]
    vertex.scripts = [list(s) for s in scripts]
    env = {**cli_env(ct_home), "CLOUDTRAIN_GCP_POLL": "0.01"}

    def cli(*args: str) -> CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)

    root = cli("submit", "train_ddp.py", "--provider", "gcp", "--spot", "--max-restarts", "2", "--detach",
               "--set", "checkpoint.interval=auto")
    assert root.returncode == 0, root.stderr
    handle = root.stdout.strip()
    waited = cli("wait", handle, "--recover", "-o", "json")
    assert waited.returncode == 0, waited.stderr
    first = status_json(cli, handle)
    events = first["timeline"]["events"]
    restarts = [e for e in events if e["e"] == "restarted"]
    assert [e["leg"] for e in restarts] == [0, 0] and all(e["to"].startswith("gcp://") for e in restarts)
    assert "preempted" in [e.get("state") for e in events if e["e"] == "ended"]
    newest = status_json(cli, restarts[-1]["to"])
    told = newest["timeline"]["events"]
    mine = next(e for e in told if e["e"] == "submitted" and e.get("handle") == restarts[-1]["to"])
    assert mine["resubmission_of"] == restarts[0]["to"]
    assert told[-1]["e"] == "ended" and told[-1]["state"] == "succeeded"
    # The newest submission's goodput is the chain's: three submissions, a leg each, each one's paid time summed,
    # the two preemptions counted; the first job alone is one submission.
    assert newest["timeline"]["chain"] == [handle, restarts[0]["to"], restarts[1]["to"]]
    chain, alone = newest["goodput"], first["goodput"]
    assert (chain["submissions"], chain["legs"], chain["preemptions"]) == (3, 3, 2)
    assert (alone["submissions"], alone["legs"]) == (1, 1) and "chain" not in first["timeline"]
    assert chain["paid_s"] > alone["paid_s"] > 0
    # ... and status says the checkpoint interval the job runs with: the one auto chose when it was planned.
    from cloudtrain.plan.checkpoint_interval import auto_interval

    chosen = auto_interval(spot=True, nodes=1, max_runtime=24 * 3600)
    assert chain["checkpoint_interval_s"] == alone["checkpoint_interval_s"] == chosen.seconds
    assert chain["checkpoint_interval_from"].startswith("auto: ") and "Young/Daly" in chain["checkpoint_interval_from"]
    text = cli("status", restarts[-1]["to"]).stdout
    assert "checkpoints: every 18m58s (auto: " in text, text


def test_a_sagemaker_job_has_the_platforms_own_states_and_its_nodes_events(aws: SageMakerFront, project: Path,
                                                                          ct_home: Path) -> None:
    """SageMaker: each secondary status status sees (Starting, Training, Interrupted ...) is a state event even
    while cloudtrain's state stays the same; the nodes' events come from CloudWatch, named by host."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.node.events import line
    from tests.clouds import write_node_log
    from tests.conftest import cli_env

    def cli(*args: str) -> CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=project, env=cli_env(ct_home),
                              capture_output=True, text=True, timeout=120)

    out = cli("submit", "train_ddp.py", "--provider", "aws", "--nodes", "2", "--gpus", "A10G:4", "--spot", "--detach")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.strip()
    job = JobHandle.parse(handle).job_id
    assert status_json(cli, handle)["state"] == "pending"
    aws.set_status(job, "InProgress", "Training")
    write_node_log(job, "algo-1", [line("step", step=5, total=50), "step 5 loss 2.30"])
    assert status_json(cli, handle)["state"] == "running"
    aws.set_status(job, "InProgress", "Interrupted")
    found = status_json(cli, handle)
    said = [e["platform"]["secondary_status"] for e in found["timeline"]["events"] if e["e"] == "state"]
    assert said == ["Starting", "Training", "Interrupted"]
    assert [(e["e"], e["node"]) for e in found["timeline"]["events"] if "node" in e] == [("step", "algo-1")]
    assert found["progress"]["step"] == 5


def test_a_kubernetes_job_has_its_conditions_and_its_pods_events(kube: FakeKube, tmp_path: Path,
                                                                 ct_home: Path) -> None:
    """Kubernetes: queued by Kueue, then a pod's events out of its log ([node-0]), then the disruption."""
    from cloudtrain.node.events import line
    from cloudtrain.sdk import plan_job
    from cloudtrain.show.metrics import story
    from cloudtrain.testing.fixtures import ddp_project
    from tests.fakes.kubernetes import STAGED, job, provider

    p = provider()
    spec = job(ddp_project(tmp_path), providers={"kubernetes": {**STAGED["providers"]["kubernetes"],
                                                                "queue": "gpus"}}).spec
    with plan_job(spec, p, progress=False) as plan:
        handle = p.submit(plan)
    p.describe(handle)
    kube.add_pod(handle.job_id, 0, log=line("restored", step=7, bytes=100, seconds=0.1, gbps=0.001) + "\n" +
                 line("step", step=9) + "\n", disrupted=True)
    kube.set_condition(handle.job_id, "Failed", "JobSetFailed")
    status = p.describe(handle)
    found = story(p, handle, status)
    kinds = [e["e"] for e in found["timeline"]["events"]]
    # the end at the platform's time for it: Kubernetes' whole seconds may put it before the pod's last lines
    assert kinds[:3] == ["submitted", "staged", "state"] and "ended" in kinds[3:]
    assert [(e["e"], e["node"]) for e in found["timeline"]["events"] if "node" in e] == [("restored", 0),
                                                                                          ("step", 0)]
    assert found["goodput"]["preemptions"] == 1 and found["progress"]["step"] == 9


def test_a_chains_goodput_sums_its_submissions_and_counts_the_steps_the_next_one_redid() -> None:
    """Recovery resubmitted a job preempted at step 50 (its checkpoint at 40): the second submission restores 40 and
    trains 10 steps again. The 8 s between the first's end and the second's start are not paid; each submission's
    paid time is priced at its own rate (the second moved to a dearer provider)."""
    from types import SimpleNamespace

    from cloudtrain.home.goodput import Ended, summarise_chain
    from cloudtrain.job_types import JobState

    def ev(kind: str, t: float, **fields: object) -> dict:
        return {"e": kind, "t": t, **fields}

    first = [ev("submitted", 0, checkpoint_interval_s=40, checkpoint_interval_from="the spec"),
             ev("node_started", 5, attempt=0), ev("step", 7, step=1, total=100),
             ev("checkpoint", 10.9, step=40, blocked_s=0.5), ev("step", 12, step=50, total=100),
             ev("ended", 12.5, state="preempted", ended_at=12)]
    second = [ev("submitted", 15), ev("node_started", 20, attempt=0), ev("restored", 22, step=40, seconds=1.0),
              ev("training_again", 23, step=41), ev("step", 29, step=100, total=100),
              ev("ended", 30, state="succeeded")]
    rates = [SimpleNamespace(hourly=3600.0, on_demand=None, nodes=1), SimpleNamespace(hourly=7200.0, on_demand=10800.0,
                                                                                     nodes=1)]
    status = SimpleNamespace(state=JobState.SUCCEEDED, started_at=20, ended_at=30, created_at=15)
    found = summarise_chain([(first, Ended.of(first, 15), rates[0]), (second, status, rates[1])])
    g = found["goodput"]
    assert (g["submissions"], g["legs"], g["steps_redone"]) == (2, 2, 10)
    assert g["paid_s"] == 7 + 10  # 5..12 (the platform's end, not when status saw it) and 20..30
    assert g["losses_s"]["waiting"] == 5 and g["losses_s"]["checkpoint_restore"] == 1
    assert g["cost_usd"] == 7 * 1.0 + 10 * 2.0  # each submission at its own price
    assert g["on_demand_kept_usd"] == pytest.approx(g["kept_s"] * 3.0, abs=0.01)
    assert g["checkpoint_interval_s"] == 40 and g["checkpoint_interval_from"] == "the spec"
    assert found["progress"]["step"] == 100
    assert Ended.of(first[:-1], 15).ended_at == 15  # an end never seen: when the next one was submitted
    from cloudtrain.show.goodput import text

    lines = text(found)
    assert any(line.startswith("goodput: ") and "over 2 submissions" in line for line in lines)
    assert "checkpoints: every 40s (the spec)" in lines
    from cloudtrain.show.metrics import exposition

    job = SimpleNamespace(handle="gcp://p/r/j", name="j", state=JobState.SUCCEEDED, restarts=1)
    parsed = families(exposition([(job, found)]))
    assert [s.value for s in parsed["cloudtrain_job_checkpoint_interval_seconds"]] == [40]
    assert [s.value for s in parsed["cloudtrain_job_paid_seconds"]] == [17]


def test_an_earlier_submission_on_a_provider_this_machine_cannot_load_keeps_the_homes_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain moved on from a provider whose extra is not installed here (or a plugin gone): `status` of the newer
    submission still counts the earlier one from the home's own events, and says its nodes' events are missing."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.home import timeline
    from cloudtrain.providers import get_provider
    from cloudtrain.show.metrics import _earlier

    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    timeline.record("nosuch://job-20261128-000000-abcd", "submitted", 1.0, handle="nosuch://job-20261128-000000-abcd")
    _, told = _earlier(JobHandle.parse("nosuch://job-20261128-000000-abcd"), get_provider)
    assert [e["e"] for e in told["events"]] == ["submitted"] and told["missing"] == 0
    assert told["logs"].startswith("the nodes' events of nosuch://job-20261128-000000-abcd are not known: ")
