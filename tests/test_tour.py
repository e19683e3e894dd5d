"""The README's tour, run as written: its `cloudtrain ...` lines are read from README.md and run in order in a fresh
folder, with real local jobs, so the tour cannot drift from what the product does. The resume step must resume: the
job run with `-- --epochs 5` continues the spec's run (same name, same checkpoint URI) from its newest checkpoint."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

README = REPO / "README.md"
EXAMPLE_HANDLE = re.compile(r"local://ddp-train-\d{8}-\d{6}-[0-9a-f]{4}")
STEPS_PER_EPOCH = 16  # the reference trainer: 2048 samples / (world size 4 x batch 32)


def readme_commands(heading: str) -> list[list[str]]:
    """The `cloudtrain` command lines of the first bash block after ``heading``, comments and continuations
    handled as bash would."""
    text = README.read_text()
    block = text[text.index(heading):].split("```bash\n", 1)[1].split("```", 1)[0]
    commands, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        words = shlex.split(line, comments=True)
        if words[:1] == ["cloudtrain"]:
            commands.append(words[1:])
    return commands


def run(args: list[str], cwd: Path, home: Path, handle: str | None) -> subprocess.CompletedProcess[str]:
    args = [handle if handle and EXAMPLE_HANDLE.fullmatch(a) else a for a in args]
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd, env=cli_env(home),
                          capture_output=True, text=True, timeout=300)


def status(handle: str, cwd: Path, home: Path) -> dict:
    return json.loads(run(["status", handle, "-o", "json"], cwd, home, None).stdout)


@pytest.mark.timeout(600)
def test_the_readme_tour_runs_as_written_and_its_resume_step_resumes(ct_home: Path, tmp_path: Path) -> None:
    project = tmp_path / "my-project"  # `cd my-project`: a fresh folder with nothing in it
    project.mkdir()
    commands = readme_commands("## A 5-minute tour")
    assert [c[0] for c in commands][:4] == ["init", "plan", "submit", "submit"], "the tour changed: update this test"
    handle = None
    seen: dict[str, subprocess.CompletedProcess[str]] = {}
    for args in commands:
        result = run(args, project, ct_home, handle)
        assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
        if args[0] == "init":
            spec = project / "cloudtrain.yaml"
            uri = (project / ".cloudtrain" / "checkpoints" / "ddp-train").as_uri()
            assert uri in spec.read_text(), "init keeps this project's checkpoints in this project"
            # Until the reference trainers also save when training ends (issue 17 item 2, another change), the
            # first run must checkpoint during the run for the next step to have something to resume from.
            spec.write_text(spec.read_text().replace('args: ["--epochs", "3"]',
                                                     'args: ["--epochs", "3", "--checkpoint-every", "16"]'))
        if args[0] == "submit" and "--detach" in args:
            handle = result.stdout.strip()
            assert handle.startswith("local://ddp-train-"), "the spec here names the job, SCRIPT or not"
            assert "note: using ./cloudtrain.yaml" in result.stderr
        seen.setdefault(" ".join(args[:2]), result)
    first = seen["submit --nodes"]
    assert "succeeded" in first.stderr and f"steps={3 * STEPS_PER_EPOCH}" in first.stdout
    assert "spec         ./cloudtrain.yaml" in seen["plan --nodes"].stdout

    # the resume step: same job name and checkpoint URI, started where the first run ended, ran to epoch 5
    assert handle is not None
    logs = run(["logs", handle], project, ct_home, None).stdout
    assert f"start_step={3 * STEPS_PER_EPOCH}" in logs, logs[-3000:]
    assert f"steps={5 * STEPS_PER_EPOCH}" in logs
    final = status(handle, project, ct_home)
    assert final["state"] == "succeeded" and final["max_restarts"] == 3, final
    checkpoints = project / ".cloudtrain" / "checkpoints" / "ddp-train"
    assert f"step-{3 * STEPS_PER_EPOCH:09d}" in [p.name for p in checkpoints.glob("step-*")]
    assert (project / "out" / "model.pt").is_file(), "outputs --download fetched the final model"
    assert json.loads(seen["schema"].stdout)["title"] == "cloudtrain job spec"


@pytest.mark.timeout(600)
def test_the_readme_preemption_rehearsal(ct_home: Path, tmp_path: Path) -> None:
    """The README's rehearsal: preempt a running job; it restarts (max_restarts 3) and resumes, then succeeds."""
    project = tmp_path / "my-project"
    project.mkdir()
    assert run(["init"], project, ct_home, None).returncode == 0
    submit, preempt, wait = readme_commands("Rehearse a spot interruption")
    assert (submit[0], preempt[0], wait[0]) == ("submit", "preempt", "wait"), "the README changed: update this test"
    handle = run(submit, project, ct_home, None).stdout.strip()
    assert handle.startswith("local://ddp-train-")
    # "while it runs": a person types preempt once the job trains; here, once its log shows an epoch done
    deadline = time.monotonic() + 240
    while "epoch 0 step" not in run(["logs", handle], project, ct_home, None).stdout:
        assert time.monotonic() < deadline, "the job never started training"
        assert status(handle, project, ct_home)["state"] in ("pending", "running")
        time.sleep(0.5)
    result = run(preempt, project, ct_home, handle)
    assert result.returncode == 0, result.stderr
    result = run(wait, project, ct_home, handle)
    assert result.returncode == 0, (result.stdout, result.stderr)
    final = status(handle, project, ct_home)
    assert final["state"] == "succeeded" and final["restarts"] == 1, final
    logs = run(["logs", handle], project, ct_home, None).stdout
    starts = [int(m) for m in re.findall(r"start_step=(\d+)", logs)]
    assert len(starts) == 2 and starts[1] > starts[0], starts
    assert f"steps={10 * STEPS_PER_EPOCH}" in logs
