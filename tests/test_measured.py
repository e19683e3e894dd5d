"""Issue 51.4, 51.9, 52.4: ``checkpoint.interval: auto`` learns from sound figures, kept when a job ends (the first
status call that sees it ended), under what they measure: the provider, machine type, node count, spot or not, and
the job's name (cloudtrain/home/measured.py). A local rehearsal never sets a cloud job's interval; a forged event
or a hand-edited file never makes the nodes checkpoint every second, nor a plan a traceback."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.plan.checkpoint_interval import FLOOR, NOTE_PREFIX
from tests.conftest import cli_env
from tests.preempted_job import READS_IT  # the tests of the one preempted job, on one worker

Cli = Callable[..., subprocess.CompletedProcess[str]]
LOCAL = {"provider": "local", "machine": None, "nodes": 1, "spot": False, "name": "train"}
P4D = {"provider": "aws", "machine": "ml.p4d.24xlarge", "nodes": 2, "spot": True, "name": "train"}


def plan(cwd: Path, home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (cwd / "train.py").write_text("print('hi')\n")
    return subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", "--set",
                           "checkpoint.interval=auto", *flags, "-o", "json"], cwd=cwd, env=cli_env(home),
                          capture_output=True, text=True, timeout=120)


def chosen(done: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    """The interval a plan gives the nodes, and its note."""
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    planned = json.loads(done.stdout)
    note = next(n for n in planned["notes"] if n.startswith(NOTE_PREFIX))
    return planned["spec"]["checkpoint"]["interval"], note


def local_plan(tmp_path: Path, home: Path, *flags: str) -> tuple[int, str]:
    return chosen(plan(tmp_path, home, "-p", "local", "--checkpoint-uri", (tmp_path / "s").as_uri(), *flags))


def p4d_plan(tmp_path: Path, home: Path) -> tuple[int, str]:
    return chosen(plan(tmp_path, home, "-p", "aws", "--gpus", "A100:8", "--nodes", "2", "--spot",
                       "--checkpoint-uri", "s3://my-bucket/run", "--set", "providers.aws.region=us-east-1"))


def keep(key: dict[str, Any], handle: str, **figures: Any) -> None:
    from cloudtrain.home import measured

    measured.remember(key, handle, {"checkpoints": 0, "preemptions": 0, "blocked_s": 0.0, "paid_s": 0.0, **figures})


def test_auto_learns_from_runs_of_the_same_job_on_the_same_machines_only(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of the job on two p4d spot nodes set the next such plan's interval; a local run of the same name, and
    the other p4d runs, never set a local plan's, nor the other way round."""
    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    keep(P4D, "aws://train-1", checkpoints=10, blocked_s=50.0, paid_s=7200.0, preemptions=2)
    keep(P4D, "aws://train-2-r1", checkpoints=10, blocked_s=50.0, paid_s=7200.0)
    keep({**P4D, "spot": False}, "aws://train-3", checkpoints=1, blocked_s=500.0, paid_s=60.0, preemptions=9)
    keep({**P4D, "nodes": 4}, "aws://train-4", checkpoints=1, blocked_s=500.0, paid_s=60.0, preemptions=9)
    keep({**P4D, "name": "other"}, "aws://other-1", checkpoints=1, blocked_s=500.0, paid_s=60.0, preemptions=9)
    seconds, note = p4d_plan(tmp_path, home)
    assert seconds == int(math.sqrt(2 * 5.0 * 14400.0 / 2)), note  # 268 s: C = 100 s / 20, M = 14400 s / 2
    assert "both measured in 2 earlier runs of the job (aws, ml.p4d.24xlarge, 2 nodes, spot)" in note, note
    seconds, note = local_plan(tmp_path, home)
    assert "both assumed" in note and seconds == 3 * 3600 + 27 * 60 + 50, note  # sqrt(2 x 30 s x 30 days)


def test_a_local_rehearsal_never_sets_a_cloud_jobs_interval_and_the_floor_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repro: a 78 s local rehearsal with one preemption made a SageMaker 2 x p4d spot plan of the same name
    checkpoint every minute, its note showing sqrt(2 x 0s x 1m18s) = 1m without saying the floor applied."""
    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    keep(LOCAL, "local://train-20261127-101010-abcd", checkpoints=3, paid_s=78.0, preemptions=1)
    seconds, note = p4d_plan(tmp_path, home)
    assert seconds == int(math.sqrt(2 * 30 * 3 * 3600)) and "both assumed" in note, note  # 13m24s, as before any run
    seconds, note = local_plan(tmp_path, home)
    assert seconds == FLOOR, note
    assert "sqrt(2 x 0s blocked per checkpoint x 1m18s between interruptions) = 0s, held to the 1m floor" in note
    assert "both measured in 1 earlier run of the job (local, 1 node)" in note, note


@pytest.mark.parametrize("figures", [
    {"checkpoints": 1, "blocked_s": float("nan"), "paid_s": 600.0, "preemptions": 1},  # one forged blocked_s: NaN
    {"checkpoints": 1, "blocked_s": 1.0, "paid_s": 1e308, "preemptions": 1},
    {"checkpoints": 1, "blocked_s": 1.0, "paid_s": 600.0, "preemptions": 1e-308},
    {"checkpoints": 1, "blocked_s": -5.0, "paid_s": 600.0, "preemptions": 1},
    {"checkpoints": True, "blocked_s": 1.0, "paid_s": 600.0, "preemptions": 1},
    {"checkpoints": 1, "blocked_s": 1.0, "paid_s": float("inf"), "preemptions": 1},
    {"checkpoints": 10**400, "blocked_s": 1.0, "paid_s": 600.0, "preemptions": 1},
    {"checkpoints": 1, "blocked_s": "5", "paid_s": 600.0, "preemptions": 1},
])
def test_figures_that_are_not_sound_are_never_used(tmp_path: Path, figures: dict[str, Any]) -> None:
    """Repro: such figures in the file made the next plan checkpoint every second, or a traceback until the file was
    deleted. Written by hand in a run's file they are passed over, and the plan says so; remember refuses them."""
    from cloudtrain.home import measured

    home = tmp_path / "home"
    run = home / "measured" / "train" / "local_train-1.json"
    run.parent.mkdir(parents=True)
    run.write_text(json.dumps({"v": 2, "handle": "local://train-1", "key": LOCAL, "figures": figures}))
    seconds, note = local_plan(tmp_path, home)
    assert FLOOR <= seconds <= 24 * 3600 and seconds == 3 * 3600 + 27 * 60 + 50, note  # the assumptions
    assert "both assumed" in note and "1 earlier run measured nothing sound (not counted)" in note, note
    assert measured.sound({"checkpoints": figures["checkpoints"], "preemptions": figures["preemptions"],
                           "paid_s": figures["paid_s"], "losses_s": {"checkpoint_save": figures["blocked_s"]}}) is None


def test_files_of_the_previous_shape_read_as_unknown(tmp_path: Path) -> None:
    """An older cloudtrain kept figures per job name (``measured/<name>.json``, rows by job id, no key): they do not
    say where the job ran, so they are not read; nor is anything else found there."""
    home = tmp_path / "home"
    (home / "measured" / "train").mkdir(parents=True)
    (home / "measured" / "train.json").write_text(json.dumps(
        {"train-20261127-101010-abcd": {"checkpoints": 10, "paid_s": 1e308, "preemptions": 1e-308, "blocked_s": 0}}))
    for name, text in {"a.json": "[" * 100_000, "b.json": "{\"v\": 2, \"key\": ", "c.json": "null", "d.json": "7",
                       "e.json": json.dumps({"v": 1, "key": LOCAL, "figures": {}}), "f.txt": "x"}.items():
        (home / "measured" / "train" / name).write_text(text)
    (home / "measured" / "train" / "g.json").mkdir()
    seconds, note = local_plan(tmp_path, home)
    assert seconds == 3 * 3600 + 27 * 60 + 50 and "both assumed until runs of the job measure them" in note, note


def test_a_kubernetes_jobs_machine_in_words_is_a_key() -> None:
    """Kubernetes names its machine "a node of the cluster" (its submitted event): still what the runs measure, so a
    job there learns as one on a cloud does; a key that is not text, or a name that is no spec's, is not."""
    from cloudtrain.home import measured

    key = {"provider": "kubernetes", "machine": "a node of the cluster", "nodes": 2, "spot": False, "name": "fit"}
    assert measured.valid_key(key)
    assert not measured.valid_key({**key, "machine": "x\n" * 3}) and not measured.valid_key({**key, "name": "../x"})
    assert not measured.valid_key({**key, "nodes": True})


def test_a_folder_where_the_name_goes_is_a_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "measured").mkdir(parents=True)
    (home / "measured" / "train").write_text("not a folder")
    seconds, note = local_plan(tmp_path, home)
    assert seconds == 3 * 3600 + 27 * 60 + 50, note


def test_the_interval_names_the_bound_that_set_it() -> None:
    from cloudtrain.plan.checkpoint_interval import auto_interval, bounded

    assert bounded(1.0, 60.0, 3600) == (FLOOR, math.sqrt(120.0), "the 1m floor")
    assert bounded(200.0, 10.0, 3600)[::2] == (400, "twice the checkpoint cost (6m40s)")
    assert bounded(30.0, 1e8, 7200)[::2] == (7200, "max_runtime (2h)")
    assert bounded(30.0, 1e3, 30)[::2] == (30, "max_runtime (30s)")  # a job shorter than the floor: its runtime
    assert bounded(30.0, 3 * 3600.0, 86400) == (804, math.sqrt(2 * 30 * 3 * 3600), None)
    note = auto_interval(spot=False, nodes=1, max_runtime=7200, cost=30.0, between=1e8, runs=1, where="local").note()
    assert "= 21h31m, held to max_runtime (2h)" in note, note
    for bad in (float("nan"), float("inf"), -1.0, 1e308):
        assumed = auto_interval(spot=True, nodes=2, max_runtime=86400, cost=bad, between=bad)
        assert not assumed.cost_measured and not assumed.between_measured and assumed.seconds == 804


def test_a_resubmission_carries_what_its_run_measures(ct_home: Path) -> None:
    """Recovery's restart runs what ran before: its submitted event names the same provider, machine, nodes, spot
    and name, so its run is learned too; a move's own submission records its own."""
    from cloudtrain.handles import JobHandle
    from cloudtrain.home import measured, timeline
    from cloudtrain.jobs.recovery import RecoveryState, _record

    root = "aws://train-20261127-101010-abcd"
    timeline.record(root, "submitted", handle=root, **P4D)
    state = RecoveryState(root=root, max_restarts=2, chain=[root], history=[{"handle": root, "why": "submitted"}])
    _record(state, JobHandle.parse("aws://train-20261127-101010-abcd-r1"), 0, "restart after preemption")
    assert measured.key_of(timeline.own_events("aws://train-20261127-101010-abcd-r1")[0]) == P4D
    _record(state, JobHandle.parse("gcp://train-20261127-101010-abcd-r2"), 0, "moved: capacity")
    assert measured.key_of(timeline.own_events("gcp://train-20261127-101010-abcd-r2")[0]) is None


# -- a job's end, learned where describe sees it -----------------------------------------------------------------

def _status(handle: str, state: str = "succeeded") -> Any:
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobState, JobStatus

    return JobStatus(handle=JobHandle.parse(handle), name="train", state=JobState(state), created_at=1000.0,
                     started_at=1001.0, ended_at=1100.0)


def _ended(monkeypatch: pytest.MonkeyPatch, handle: str, own: list[dict[str, Any]], lines: list[str] = (),
           state: str = "succeeded", key: dict[str, Any] | None = None) -> None:
    """``handle`` submitted with ``key`` and seen ended by describe: ``own`` in the home's events file (the local
    supervisor's), ``lines`` in its nodes' logs (``[default0]:`` before a worker's event), both as written,
    unchecked."""
    from cloudtrain import providers, registry
    from cloudtrain.home import timeline

    timeline.record(handle, "submitted", 1000.0, handle=handle, **(key or LOCAL))
    with timeline.path(handle).open("a") as f:
        f.writelines(json.dumps(e) + "\n" for e in own)

    class Logs:
        def logs(self, handle: Any, follow: bool = False) -> list[str]:
            return list(lines)

    with monkeypatch.context() as patched:
        patched.setattr(registry, "get_provider", lambda name: Logs())
        providers._observe(_status(handle, state))


def event(kind: str, t: float, worker: bool = True, **fields: Any) -> str:
    return ("[default0]:" if worker else "") + "cloudtrain-event " + json.dumps({"e": kind, "t": t, **fields})


def test_a_run_is_learned_once_when_describe_first_sees_it_ended(ct_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Repro: figures were kept only when someone rendered `status`, and a status before the preemption kept 0
    preemptions. Now the end is learned where every provider's describe reports it, once per handle."""
    from cloudtrain import providers
    from cloudtrain.home import measured, timeline

    handle = "local://train-20261127-101010-abcd"
    own = [{"e": "node_started", "t": 1001.0, "attempt": 0}, {"e": "preempted", "t": 1050.0, "attempt": 0},
           {"e": "node_started", "t": 1052.0, "attempt": 1}]
    lines = [event("step", 1005.0, step=1), event("checkpoint", 1010.0, step=10, blocked_s=4.0),
             event("checkpoint", 1060.0, step=20, blocked_s=2.0), event("step", 1090.0, step=30)]
    providers._observe(_status(handle, "running"))  # not ended: nothing learned
    assert not (ct_home / "measured").exists()
    _ended(monkeypatch, handle, own, lines)
    found = measured.read(LOCAL)
    assert (found.runs, found.checkpoints, found.blocked_s, found.preemptions) == (1, 2, 6.0, 1), found
    assert 90 < found.paid_s < 100 and found.cost == 3.0 and found.between == found.paid_s
    monkeypatch.setattr(timeline, "read", lambda *a: pytest.fail("learned twice"))
    providers._observe(_status(handle))


def test_a_forged_event_is_never_a_figure_nor_breaks_describe(ct_home: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Repro: one forged ``blocked_s: NaN`` was remembered and the next plan said ``auto: 1s``; a ``node_started``
    at NaN made the next plan a traceback. The run counts as measured nothing sound."""
    from cloudtrain.home import goodput, measured

    _ended(monkeypatch, "local://train-1", [], [event("checkpoint", 1010.0, step=1, blocked_s=float("nan"))])
    _ended(monkeypatch, "local://train-2", [{"e": "node_started", "t": float("nan"), "attempt": 0},
                                            {"e": "preempted", "t": 1050.0, "attempt": 0}])
    _ended(monkeypatch, "local://train-3", [], [event("checkpoint", 1010.0, step=1, blocked_s="a lot")])
    _ended(monkeypatch, "local://train-4", [], [event("step", 1010.0, step=10**400, total=7)])
    _ended(monkeypatch, "local://train-5", [{"e": "node_started", "t": 1e308, "attempt": 0}],
           [event("node_started", -1e308, False, rank=0)])
    found = measured.read(LOCAL)
    assert math.isfinite(found.blocked_s) and math.isfinite(found.paid_s) and found.paid_s < 1000, found
    assert found.runs + found.unsound == 5 and found.preemptions <= 1 and capsys.readouterr().err == ""
    seconds, note = local_plan(tmp_path, ct_home)
    assert FLOOR <= seconds <= 24 * 3600, note
    monkeypatch.setattr(goodput, "summarise", lambda *a: {}["a bug"])  # a bug of cloudtrain's: said, describe goes on
    _ended(monkeypatch, "local://train-6", [])
    assert "could not keep what local://train-6 measured" in capsys.readouterr().err


def test_a_job_submitted_by_an_older_cloudtrain_is_not_learned(ct_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain import providers
    from cloudtrain.home import timeline

    timeline.record("local://train-1", "submitted", 1000.0, handle="local://train-1", provider="local", nodes=1)
    monkeypatch.setattr(timeline, "read", lambda *a: pytest.fail("an unkeyed run is not worked out"))
    providers._observe(_status("local://train-1"))
    assert not (ct_home / "measured").exists()


NUMBERS = st.one_of(st.floats(), st.integers(min_value=-(10**30), max_value=10**400), st.booleans(), st.none(),
                    st.text(max_size=3))
EVENTS = st.lists(st.fixed_dictionaries({"e": st.sampled_from(["checkpoint", "node_started", "preempted", "step",
                                                                 "restored", "training_again", "ended"]),
                                         "t": st.one_of(st.floats(), st.integers(-10, 10**20),
                                                        st.floats(900, 1200))},
                                        optional={"blocked_s": NUMBERS, "attempt": st.integers(0, 3),
                                                  "step": NUMBERS, "seconds": NUMBERS, "total": NUMBERS,
                                                  "state": st.just("preempted")}), max_size=6)
FIGURES = st.dictionaries(st.sampled_from(["checkpoints", "blocked_s", "paid_s", "preemptions"]), NUMBERS)
FILES = st.lists(st.one_of(FIGURES.map(lambda f: {"v": 2, "handle": "x", "key": LOCAL, "figures": f}),
                           st.recursive(NUMBERS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                                        max_leaves=6)), max_size=4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=FILES, old=st.one_of(st.none(), FIGURES), own=EVENTS, nodes=EVENTS, workers=EVENTS,
       max_runtime=st.integers(60, 365 * 86400), state=st.sampled_from(["succeeded", "preempted", "failed"]))
def test_any_measured_file_and_any_events_plan_within_the_bounds(
        ct_home: Path, project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        files: list[Any], old: Any, own: list[dict[str, Any]], nodes: list[dict[str, Any]],
        workers: list[dict[str, Any]], max_runtime: int, state: str) -> None:
    """Whatever the measured files hold and whatever events a job's timeline had when it ended: describe goes on,
    and the next plan of ``interval: auto`` is within [FLOOR, max_runtime], never a traceback."""
    from cloudtrain.plan.planner import plan_job
    from cloudtrain.spec.model import JobSpec

    shutil.rmtree(ct_home / "measured", ignore_errors=True)
    shutil.rmtree(ct_home / "events", ignore_errors=True)
    (ct_home / "measured" / "train").mkdir(parents=True)
    if old is not None:
        (ct_home / "measured" / "train.json").write_text(json.dumps({"train-1": old}, default=str))
    for n, data in enumerate(files):
        (ct_home / "measured" / "train" / f"run-{n}.json").write_text(json.dumps(data, default=str))
    lines = [event(e["e"], **{k: v for k, v in e.items() if k != "e"}, worker=False) for e in nodes] + \
        [event(e["e"], **{k: v for k, v in e.items() if k != "e"}) for e in workers]
    _ended(monkeypatch, "local://train-20261127-101010-abcd", own, lines, state)
    assert "could not keep what" not in capsys.readouterr().err  # no bug of cloudtrain's met on the way
    spec = JobSpec(name="train", script="train_ddp.py", source_dir=str(project), max_runtime=max_runtime,
                   checkpoint={"uri": (project.parent / "s").as_uri(), "interval": "auto"})
    with plan_job(spec, "local", progress=False) as planned:
        seconds = planned.spec.checkpoint.interval
        assert any(n.startswith(NOTE_PREFIX) for n in planned.notes)
    assert isinstance(seconds, int) and FLOOR <= seconds <= max_runtime


# -- real local jobs -------------------------------------------------------------------------------------------

FORGED = """import json, time
line = 'cloudtrain-event ' + json.dumps({"e": "checkpoint", "t": time.time(), "step": 1, "blocked_s": 2.0})
print(line, flush=True)
print(line.replace('2.0', 'NaN').replace('"step": 1', '"step": 2'), flush=True)
"""


@pytest.mark.slow
def test_a_real_job_with_a_forged_checkpoint_event_never_makes_the_nodes_checkpoint_every_second(
        cli: Cli, tmp_path: Path, ct_home: Path) -> None:
    """Repro: a script that prints one ``checkpoint`` event with ``blocked_s: NaN`` made the next plan of its name
    say ``auto: 1s``, once `status` was rendered. Its end is learned by the describe that sees it (here the
    foreground submit's wait), a status changes nothing, and the next plan keeps to its floor at least."""
    (tmp_path / "train.py").write_text(FORGED)
    done = cli("submit", "train.py", "--checkpoint-uri", (tmp_path / "store").as_uri())
    assert done.returncode == 0, done.stderr
    assert "could not keep what" not in done.stderr
    handle = next(w for w in (done.stdout + done.stderr).split() if w.startswith("local://"))
    assert cli("status", handle).returncode == 0
    runs = list((ct_home / "measured" / "train").iterdir())
    assert len(runs) == 1 and "NaN" not in runs[0].read_text()  # kept at the end, without the forged figure
    seconds, note = local_plan(tmp_path, ct_home)
    assert FLOOR <= seconds <= 24 * 3600 and f"{NOTE_PREFIX} 1s " not in note, note


@pytest.mark.slow
@READS_IT
def test_a_real_preempted_job_sets_the_next_plans_interval(preempted_job: tuple[Cli, str, Path]) -> None:
    """Repro: a status rendered before the preemption kept 0 preemptions, and nothing kept the end. The job's end
    is learned when describe first sees it (its `wait`), preemption and all: the next plan of the same job on the
    same machines (local, one node, spot) chooses from its checkpoints and its preemption."""
    cli, handle, home = preempted_job
    from cloudtrain.home.measured import Measured

    record = json.loads(next((home / "measured" / "train-ddp").iterdir()).read_text())
    figures = record["figures"]
    assert record["handle"] == handle and figures["preemptions"] == 1 and figures["checkpoints"] >= 2, record
    told = Measured(1, figures["checkpoints"], figures["blocked_s"], figures["paid_s"], figures["preemptions"])
    assert told.cost is not None and told.between is not None
    out = cli("plan", str(home.parent / "proj" / "train_ddp.py"), "--spot", "--checkpoint-uri",
              (home.parent / "again").as_uri(), "--set", "checkpoint.interval=auto", "-o", "json")
    seconds, note = chosen(out)
    assert "both measured in 1 earlier run of the job (local, 1 node, spot)" in note, note
    assert seconds == max(FLOOR, int(math.sqrt(2 * told.cost * told.between)), int(2 * told.cost)), note
