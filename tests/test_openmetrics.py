"""Issue 51.3: `status -o openmetrics` of the whole home, which one bad job cannot void. A job's negative, NaN or text
figure, a job whose figures cannot be worked out at all, a copy of a job's events file: before, each made
prometheus_client refuse the whole exposition (or the command a traceback), the healthy jobs lost with it. Every
exposition here is read back with prometheus_client's own parser; ``exposition()`` is also handed hostile figures
directly (defence in depth: the timeline's own checks may refuse such events before they get here)."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from cloudtrain.handles import JobHandle
from cloudtrain.home import goodput
from cloudtrain.job_types import JobState, JobStatus
from cloudtrain.show.metrics import exposition
from tests import plugins

toy_plugin = plugins.toy_plugin  # a fixture

T0 = 1_800_000_000.0


def samples(text: str) -> list[Any]:
    """Every sample, as prometheus_client's parser reads the text (it raises on anything OpenMetrics refuses)."""
    assert text.endswith("# EOF\n")
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def of(text: str, handle: str) -> dict[tuple[str, str], float]:
    """(sample name, cause or state label) -> value of one job."""
    return {(s.name, s.labels.get("cause") or s.labels.get("cloudtrain_job_state", "")): s.value
            for s in samples(text) if s.labels.get("handle") == handle}


def events(blocked_s: Any = 0.5) -> list[dict[str, Any]]:
    return [{"e": "submitted", "t": T0}, {"e": "node_started", "t": T0 + 5, "attempt": 0},
            {"e": "step", "t": T0 + 7, "step": 1, "total": 100},
            {"e": "checkpoint", "t": T0 + 9, "step": 5, "blocked_s": blocked_s},
            {"e": "step", "t": T0 + 20, "step": 100, "total": 100}, {"e": "ended", "t": T0 + 21, "state": "succeeded"}]


def job(job_id: str, name: str = "fit") -> tuple[JobStatus, dict[str, Any]]:
    """(status, figures) as `status` works them out for a short succeeded job."""
    status = JobStatus(handle=JobHandle.parse(f"local://{job_id}"), name=name, state=JobState.SUCCEEDED,
                       created_at=T0, started_at=T0 + 5, ended_at=T0 + 21, restarts=0)
    return status, {**goodput.summarise(events(), status),
                    "timeline": {"events": events(), "missing": 0, "logs": None}}


def with_goodput(pair: tuple[JobStatus, dict[str, Any]], **changes: Any) -> tuple[JobStatus, dict[str, Any]]:
    status, found = pair
    return status, {**found, "goodput": {**found["goodput"], **changes}}


def test_a_healthy_exposition_parses_with_every_family() -> None:
    status, found = job("fit-1")
    found["goodput"].update(step_time_s={"ideal": 0.25, "recent": 0.5, "deviation": 0.25})
    found["timeline"]["ignored"] = {"count": 3, "kinds": {"checkpoint": 3}}
    text = exposition([(status, found)])
    got = of(text, "local://fit-1")
    assert got[("cloudtrain_job_state", "succeeded")] == 1 and got[("cloudtrain_job_state", "running")] == 0
    assert got[("cloudtrain_job_step", "")] == 100 and got[("cloudtrain_job_restarts_total", "")] == 0
    assert got[("cloudtrain_job_ideal_step_seconds", "")] == 0.25
    assert got[("cloudtrain_job_step_time_deviation_seconds", "")] == 0.25
    assert got[("cloudtrain_job_events_ignored", "")] == 3
    assert got[("cloudtrain_job_paid_seconds_total", "")] == found["goodput"]["paid_s"]
    for cause, seconds in found["goodput"]["losses_s"].items():
        if seconds is not None:
            assert got[("cloudtrain_job_lost_seconds", cause)] == pytest.approx(seconds)
    assert "# UNIT cloudtrain_job_ideal_step_seconds seconds" in text
    assert "# TYPE cloudtrain_job_events_ignored gauge" in text


def test_figures_before_the_reshaped_goodput_still_export() -> None:
    """The figures as they were (no step_time_s, no ignored count) and as they will be: both export."""
    status, found = job("fit-1")
    found["goodput"].pop("step_time_s", None)
    found["timeline"].pop("ignored", None)
    got = of(exposition([(status, found)]), "local://fit-1")
    assert ("cloudtrain_job_ideal_step_seconds", "") not in got and got[("cloudtrain_job_step", "")] == 100


def test_one_jobs_negative_counter_leaves_that_sample_out_not_the_home() -> None:
    bad = with_goodput(job("bad-1"), losses_s={"checkpoint_save": -3.0, "waiting": 5.0}, paid_s=-1)
    text = exposition([job("good-1"), bad])
    assert of(text, "local://good-1")[("cloudtrain_job_step", "")] == 100  # the healthy job is there
    got = of(text, "local://bad-1")
    assert ("cloudtrain_job_lost_seconds", "checkpoint_save") not in got
    assert ("cloudtrain_job_paid_seconds_total", "") not in got
    assert got[("cloudtrain_job_lost_seconds", "waiting")] == 5 and got[("cloudtrain_job_step", "")] == 100


def test_nan_and_infinity_are_never_written() -> None:
    bad = with_goodput(job("bad-1"), losses_s={"other": math.nan, "waiting": math.inf}, ratio=math.nan,
                       checkpoint_age_s=-math.inf, cost_usd=math.nan,
                       step_time_s={"ideal": math.inf, "recent": None, "deviation": -0.5})
    text = exposition([bad, job("good-1")])
    assert all(math.isfinite(s.value) for s in samples(text))
    assert not [line for line in text.splitlines() if line.rsplit(" ", 1)[-1].lower().lstrip("+-") in ("nan", "inf")]
    got = of(text, "local://bad-1")
    assert not any(name in got for name in [("cloudtrain_job_goodput_ratio", ""), ("cloudtrain_job_cost_usd_total", ""),
                                            ("cloudtrain_job_checkpoint_age_seconds", ""),
                                            ("cloudtrain_job_ideal_step_seconds", "")])
    # no figure of cloudtrain's is negative (the deviation is how much slower than ideal): none is written
    assert ("cloudtrain_job_step_time_deviation_seconds", "") not in got
    assert of(text, "local://good-1")[("cloudtrain_job_step", "")] == 100


def test_text_and_bools_are_not_numbers() -> None:
    status, found = with_goodput(job("bad-1"), losses_s={"checkpoint_save": "slow"}, preemptions=True,
                                 ratio="0.5", checkpoint_interval_s=[60])
    found = {**found, "progress": {**found["progress"], "step": True, "steps_per_s": "fast"}}
    text = exposition([(status, found)])
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")]
    assert not {"True", "slow", "fast", "[60]"} & set(values), values
    got = of(text, "local://bad-1")
    assert ("cloudtrain_job_step", "") not in got and ("cloudtrain_job_preemptions_total", "") not in got
    assert ("cloudtrain_job_goodput_ratio", "") not in got
    assert got[("cloudtrain_job_state", "succeeded")] == 1


def test_numbers_are_written_the_openmetrics_way() -> None:
    status, found = with_goodput(job("fit-1"), paid_s=1e21, cost_usd=1.5, preemptions=2, ratio=1e-7)
    lines = exposition([(status, found)]).splitlines()

    def value(name: str) -> str:
        return next(line for line in lines if line.startswith(name + "{")).rsplit(" ", 1)[1]

    assert value("cloudtrain_job_paid_seconds_total") == "1e+21"
    assert value("cloudtrain_job_cost_usd_total") == "1.5"
    assert value("cloudtrain_job_preemptions_total") == "2"
    assert float(value("cloudtrain_job_goodput_ratio")) == 1e-7
    assert value("cloudtrain_job_step") == "100"


def test_a_job_whose_figures_break_is_left_out_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    status, found = job("broken-1")
    broken = (status, {**found, "goodput": None})
    text = exposition([job("good-1"), broken, job("good-2")])
    assert not of(text, "local://broken-1")
    assert of(text, "local://good-1") and of(text, "local://good-2")
    err = capsys.readouterr().err
    assert "cloudtrain: warning: local://broken-1 left out of the metrics: " in err, err


def test_one_sample_set_per_handle() -> None:
    text = exposition([job("fit-1"), job("fit-1"), job("fit-2")])
    parsed = samples(text)  # before: "Invalid metric grouping"
    steps = [s for s in parsed if s.name == "cloudtrain_job_step"]
    assert sorted(s.labels["handle"] for s in steps) == ["local://fit-1", "local://fit-2"]


def test_labels_are_escaped() -> None:
    status, found = job("fit-1", name='a "quoted"\nname \\ here')
    parsed = samples(exposition([(status, found)]))
    assert {s.labels["name"] for s in parsed} == {'a "quoted"\nname \\ here'}


# -- through a home: `cloudtrain status -o openmetrics` ---------------------------------------------------------

def recorded_job(home: Path, job_id: str, kind: str = "", key: str = "", written: str = "") -> str:
    """A local job that ended, as the home holds it: its record and its timeline, where the ``kind`` event's ``key``
    is ``written`` as given (JSON text) in its events file."""
    from cloudtrain.providers.local.jobdb import JobDB, JobRecord

    job_dir = home / "jobs" / job_id
    job_dir.mkdir(parents=True)
    JobDB(home / "jobs.db").insert(JobRecord(id=job_id, name=job_id, state="succeeded", job_dir=str(job_dir),
                                             created_at=T0, started_at=T0 + 5, ended_at=T0 + 21,
                                             plan={"nodes": [], "request": {"max_restarts": 0}, "spec": {}}))
    handle = f"local://{job_id}"
    lines = []
    for e in events():
        e = {**e, "handle": handle} if e["e"] == "submitted" else e
        lines.append(json.dumps({**e, key: "@"}).replace('"@"', written) if e["e"] == kind else json.dumps(e))
    (home / "events").mkdir(exist_ok=True)
    (home / "events" / f"local_{job_id}.jsonl").write_text("\n".join(lines) + "\n")
    return handle


@pytest.mark.parametrize("broken", [("checkpoint", "blocked_s", "-3"), ("checkpoint", "blocked_s", '"slow"'),
                                 ("node_started", "t", "NaN")], ids=["negative", "text", "nan"])
def test_one_bad_job_in_the_home_does_not_void_the_exposition(cli: Any, ct_home: Path,
                                                              broken: tuple[str, str, str]) -> None:
    good = recorded_job(ct_home, "good-20260101-000000-0001")
    bad = recorded_job(ct_home, "bad-20260101-000000-0002", *broken)
    out = cli("status", "-o", "openmetrics")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert of(out.stdout, good)[("cloudtrain_job_step", "")] == 100
    assert all(math.isfinite(s.value) for s in samples(out.stdout))
    # the bad job is there (what could be worked out of it) or left out and named: never the home's exposition lost
    assert of(out.stdout, bad) or f"cloudtrain: warning: {bad} left out of the metrics: " in out.stderr, out.stderr


def test_a_copied_events_file_puts_its_job_in_once(cli: Any, ct_home: Path) -> None:
    handle = recorded_job(ct_home, "fit-20260101-000000-0001")
    recorded_job(ct_home, "other-20260101-000000-0002")
    events_file = ct_home / "events" / "local_fit-20260101-000000-0001.jsonl"
    shutil.copy(events_file, events_file.with_name("copy-of-fit.jsonl"))
    time.sleep(0.01)
    out = cli("status", "-o", "openmetrics")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    steps = [s.labels["handle"] for s in samples(out.stdout) if s.name == "cloudtrain_job_step"]
    assert sorted(steps) == sorted([handle, "local://other-20260101-000000-0002"])


def test_a_job_whose_provider_breaks_is_left_out_and_named(cli: Any, ct_home: Path, toy_plugin: Path) -> None:
    """A plugin's describe that raises what no cloudtrain error is (a toy job whose state file is gone): before, the
    whole command was a traceback."""
    good = recorded_job(ct_home, "good-20260101-000000-0001")
    folder = ct_home / "toy-spool" / "gone-1"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{}")  # and no state file: the toy provider's describe raises OSError
    (ct_home / "events" / "toy_gone-1.jsonl").write_text(json.dumps({"e": "submitted", "t": T0,
                                                                      "handle": "toy://gone-1"}) + "\n")
    out = cli("status", "-o", "openmetrics")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert of(out.stdout, good)[("cloudtrain_job_step", "")] == 100
    assert "cloudtrain: warning: toy://gone-1 left out of the metrics: FileNotFoundError" in out.stderr, out.stderr
