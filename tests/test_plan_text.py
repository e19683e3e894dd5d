"""Plans read by someone about to pay (issue 17, items 4 and 8): the spot max_wait, notes that do not contradict the
settings, unset settings shown as unset, a short summary for many nodes, readable print()/repr() of Plan, Job and Run,
and saved plans: `plan -o json > plan.json` then `submit --plan plan.json` submits that plan with its job id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain import Job, Run
from cloudtrain.cli.render import plan_text
from cloudtrain.sdk import plan_job
from cloudtrain.spec.model import validate_spec
from tests.conftest import cli_env


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "train.py").write_text("print('trained')\n")
    return root


def _summary(src: Path, provider: str, **fields: object) -> str:
    spec = validate_spec({"script": "train.py", "source_dir": str(src), **fields})
    with plan_job(spec, provider, progress=False) as plan:
        text = plan_text(plan)
    return text.split("\nrequest:")[0]


AWS = {"providers": {"aws": {"region": "us-east-1"}}}


def test_spot_shows_max_wait_where_the_platform_uses_it(src: Path) -> None:
    text = _summary(src, "aws", spot=True, accelerator="A100:8", **AWS)
    assert "spot         yes, no restarts (max_restarts 0), max_wait 2d (capacity wait plus run time)" in text
    text = _summary(src, "gcp", spot=True, max_wait="36h", accelerator="A100:8")
    assert "max_wait 36h (not used by gcp)" in text
    assert "spot         no" in _summary(src, "aws", **AWS)


def test_azure_spot_notes_match_max_restarts(src: Path) -> None:
    base = {"spot": True, "accelerator": "A100:8", "image": {"torch_version": "2.2"}}
    none = _summary(src, "azure", **base)
    assert "(max_restarts=0)" not in none and "cloudtrain resubmits it" not in none
    assert "with max_restarts 0 nothing resubmits it" in none and "--max-restarts" in none
    three = _summary(src, "azure", max_restarts=3, **base)
    assert "cloudtrain resubmits it (up to 3 time(s))" in three


def test_unset_settings_read_as_unset_not_as_placeholder_names(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CLOUDTRAIN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "CLOUDTRAIN_GCP_BUCKET",
                 "CLOUDTRAIN_AWS_ROLE", "CLOUDTRAIN_AWS_BUCKET", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(src.parent / "no-gcloud"))
    gcp = _summary(src, "gcp")
    assert "where        project <providers.gcp.project not set>, region" in gcp
    assert "gs://<providers.gcp.bucket not set>/cloudtrain/bundles/" in gcp
    assert "set-providers-" not in gcp
    aws = _summary(src, "aws", **AWS)
    assert "s3://<providers.aws.bucket not set>/" in aws and "set-providers-" not in aws


def test_many_nodes_are_summarised(src: Path) -> None:
    text = _summary(src, "aws", nodes=128, accelerator="A100:8", **AWS)
    assert "126 more node(s), same command with their own rank" in text
    assert len(text.splitlines()) < 40, text


def test_a_file_checkpoint_on_a_cloud_is_called_out(src: Path) -> None:
    text = _summary(src, "aws", checkpoint={"uri": "file:///tmp/ckpt/run"}, **AWS)
    assert "CHECKPOINT MOVED: checkpoint.uri file:///tmp/ckpt/run is on this computer" in text
    spec = validate_spec({"script": "train.py", "source_dir": str(src), "checkpoint": {"uri": "file:///tmp/ckpt/run"},
                          **AWS})
    with plan_job(spec, "aws", progress=False) as plan:
        assert "file:///tmp/ckpt" not in json.dumps(plan.to_dict(redact=False)["request"])  # never sent to the nodes
    assert "CHECKPOINT MOVED" not in _summary(src, "local", checkpoint={"uri": "file:///tmp/ckpt/run"})


def test_the_job_id_line_says_when_it_holds(src: Path) -> None:
    assert "each submit names its job anew; `submit --plan` a plan saved with -o json keeps this id" in \
        _summary(src, "local")


def test_print_and_repr_are_readable(src: Path) -> None:
    job = Job(script="train.py", source_dir=str(src), nodes=2, procs_per_node=2, env={"HF_TOKEN": "hf_" + "x" * 20})
    assert repr(job).startswith("Job(name='train'") and "\n" not in repr(job)
    shown = str(job)
    assert shown.startswith("Job train\n") and "2 node(s) x 2 process(es), ddp" in shown
    assert "HF_TOKEN=****" in shown and "x" * 20 not in shown
    with job.plan("local") as plan:
        text = str(plan)
        assert text.startswith("provider     local\njob          train-") and "request:" not in text
        assert len(repr(plan)) < 200 and repr(plan).startswith("<Plan local train-")
        assert "2 node(s) x 2 process(es)" in repr(plan)
    gone = Run.attach("local://no-such-job")
    assert str(gone).startswith("local://no-such-job (status unavailable: no local job")
    assert repr(gone) == "Run('local://no-such-job')"


# -- saved plans ------------------------------------------------------------------------------------------------


@pytest.fixture
def saved(ct_home: Path, src: Path) -> Path:
    """As the README saves it: `plan ... -o json > plan.json` in the project (the shell creates the empty file in the
    source folder before cloudtrain packages it)."""
    path = src / "plan.json"
    with open(path, "w") as out:
        result = subprocess.run([sys.executable, "-m", "cloudtrain", "plan", "train.py", "--env",
                                 "HF_TOKEN=hf_abcdefghijklmnopqrstu", "-o", "json"], cwd=src, env=cli_env(ct_home),
                                stdout=out, stderr=subprocess.PIPE, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "hf_abcdefghijklmnopqrstu" not in path.read_text(), "a saved plan never holds a secret"
    return path


def test_a_saved_plan_is_submitted_as_it_is_with_its_job_id(cli, ct_home: Path, src: Path, saved: Path) -> None:
    job_id = json.loads(saved.read_text())["job_id"]
    env = ["--env", "HF_TOKEN=hf_abcdefghijklmnopqrstu"]
    first = cli("submit", "--plan", str(saved), *env, "--detach", cwd=src)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"local://{job_id}", "the job the plan showed is the job submitted"
    again = cli("submit", "--plan", str(saved), *env, "--detach", cwd=src)
    assert again.stdout.strip() == f"local://{job_id}", "a saved plan submitted twice is one job"
    waited = cli("wait", f"local://{job_id}", cwd=src)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    listed = json.loads(cli("list", "-o", "json", cwd=src).stdout)
    assert [j["handle"] for j in listed] == [f"local://{job_id}"]
    assert "succeeded" in str(Run.attach(f"local://{job_id}"))


@pytest.mark.parametrize(
    ("change", "extra", "needle"),
    [("", [], "--plan: '{plan}' holds secret environment values masked: HF_TOKEN"),
     ("", ["--env", "HF_TOKEN=x", "--env", "OTHER=1"], "--env OTHER would change the saved plan"),
     ("", ["--env", "HF_TOKEN=x", "--nodes", "2"], "--plan: --nodes cannot change a saved plan"),
     ("", ["--env", "HF_TOKEN=x", "-p", "aws"], "is a plan for local, not aws"),
     ("source", ["--env", "HF_TOKEN=x"], "the source changed since '{plan}' was planned"),
     ("age", ["--env", "HF_TOKEN=x"], "was planned 48 hours ago"),
     ("garbage", [], "is not a plan saved by this version of cloudtrain"),
     ("job id", [], "is not a plan saved by this version of cloudtrain")],
)
def test_a_saved_plan_that_no_longer_holds_is_refused(cli, ct_home: Path, src: Path, saved: Path, change: str,
                                                      extra: list[str], needle: str) -> None:
    if change == "source":
        (src / "train.py").write_text("print('changed')\n")
    elif change == "age":
        data = json.loads(saved.read_text())
        data["created_at"] = time.time() - 48 * 3600
        saved.write_text(json.dumps(data))
    elif change == "garbage":
        saved.write_text(json.dumps({"provider": "local"}))
    elif change == "job id":  # a job id is a path part and a label: no way out of the job folder
        saved.write_text(json.dumps({**json.loads(saved.read_text()), "job_id": "../../escape"}))
    result = cli("submit", "--plan", str(saved), *extra, "--detach", cwd=src)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert needle.format(plan=saved) in result.stderr, result.stderr
    assert not (ct_home / "jobs.db").exists() and not (ct_home / "store").exists(), "nothing staged or recorded"


def test_many_more_local_processes_than_cpus_is_a_note_not_an_error(cli, src: Path) -> None:
    """Issue 28.12: a local job runs every node on this machine; far more processes than its CPUs runs, slowly,
    and the plan says so. Up to twice the CPUs (2 x 2 on a laptop) goes without saying."""
    from cloudtrain.providers.local.provider import crowded_note

    cpus = len(os.sched_getaffinity(0))
    out = cli("plan", "train.py", "--nodes", "2", "--procs-per-node", str(8 * cpus), cwd=src)
    assert out.returncode == 0, out.stderr
    assert f"local: {16 * cpus} processes (2 node(s) x {8 * cpus}) on this machine's {cpus} CPU(s), 16 per CPU: it " \
           "runs, slowly" in out.stdout
    assert crowded_note(2, 2, cpus=2) is None and crowded_note(1, 5, cpus=2) is not None
