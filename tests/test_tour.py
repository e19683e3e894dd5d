"""The README's tour, run as written: its `cloudtrain ...` lines are read from README.md and run in order in a fresh
folder, with real local jobs, so the tour cannot drift from what the product does. The resume step must resume: the
job run with `-- --epochs 5` continues the spec's run (same name, same checkpoint URI) from its newest checkpoint."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

README = REPO / "README.md"
EXAMPLE_HANDLE = re.compile(r"local://(?:ddp-train|rehearsal)-\d{8}-\d{6}-[0-9a-f]{4}")
STEPS_PER_EPOCH = 16  # the reference trainer: 2048 samples / (world size 4 x batch 32)


def readme_lines(heading: str) -> list[str]:
    """The command lines of the first bash block after ``heading``, continuations joined as bash joins them."""
    text = README.read_text()
    block = text[text.index(heading):].split("```bash\n", 1)[1].split("```", 1)[0]
    lines, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line)
    return lines


def readme_commands(heading: str) -> list[list[str]]:
    """The `cloudtrain` command lines of the first bash block after ``heading``, as argument lists (comments
    handled as bash would)."""
    words = (shlex.split(line, comments=True) for line in readme_lines(heading))
    return [w[1:] for w in words if w[:1] == ["cloudtrain"]]


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
            # 29.5: the spec is used as init wrote it (the reference trainer saves when training ends)
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


def test_the_tour_makes_the_folder_it_enters_and_says_how_to_get_cpu_torch() -> None:
    """29.8: the tour said `cd my-project` with no folder made, and `pip install -e '.[local]'` on a laptop without
    CUDA pulled a multi-GB CUDA torch."""
    lines = readme_lines("## A 5-minute tour")
    made: set[str] = set()
    for line in lines:
        for part in line.split("#", 1)[0].split("&&"):
            words = shlex.split(part)
            if words[:1] == ["mkdir"]:
                made.update(w for w in words[1:] if not w.startswith("-"))
            if words[:1] == ["cd"]:
                assert words[1] in made, f"the tour enters {words[1]} before making it"
    installs = [n for n, line in enumerate(lines) if line.startswith("pip install")]
    assert "download.pytorch.org/whl/cpu" in lines[installs[0]] and "'.[local]'" in lines[installs[1]], lines


def shim(folder: Path) -> dict[str, str]:
    """A `cloudtrain` command on PATH that runs this checkout, so README lines run through bash as written."""
    folder.mkdir()
    (folder / "cloudtrain").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cloudtrain "$@"\n')
    (folder / "cloudtrain").chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.timeout(600)
def test_the_readme_preemption_rehearsal(ct_home: Path, tmp_path: Path) -> None:
    """29.5: the README's rehearsal, after the tour's runs and each line through bash as written: a new run from step
    0 (before, it resumed the tour's run near its end and finished before `preempt` could be typed); `logs -f` until
    the line the README names, Ctrl-C, `preempt`; it restarts (max_restarts 3), resumes from the checkpoint the
    preemption saved, and succeeds."""
    project = tmp_path / "my-project"
    project.mkdir()
    assert run(["init"], project, ct_home, None).returncode == 0
    # what the tour left: a finished run of this project with a checkpoint at its end
    assert run(["submit", "--nodes", "2", "--procs-per-node", "2", "--", "--epochs", "2"],
               project, ct_home, None).returncode == 0
    env = {**cli_env(ct_home), **shim(tmp_path / "bin")}
    lines = readme_lines("Rehearse a spot interruption")
    assert [shlex.split(line)[:2] for line in lines] == [["cloudtrain", w] for w in
                                                          ("submit", "logs", "preempt", "wait", "logs")], lines
    submit, follow, preempt, wait, merged = lines
    said = re.search(r'when it shows "([^"]+)"', follow)
    assert said, "the README says when to preempt"

    def bash(line: str, handle: str | None = None) -> subprocess.CompletedProcess[str]:
        line = EXAMPLE_HANDLE.sub(handle, line) if handle else line
        return subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True, text=True, timeout=300)

    submitted = bash(submit)
    assert submitted.returncode == 0, submitted.stderr
    handle = submitted.stdout.strip()
    assert handle.startswith("local://rehearsal-"), handle
    # `logs -f` as a person watches it, until the line the README names, then Ctrl-C (SIGINT to its process group)
    watcher = subprocess.Popen(["bash", "-c", EXAMPLE_HANDLE.sub(handle, follow)], cwd=project, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in watcher.stdout or []:
        seen.append(line)
        if said.group(1) in line:
            break
    os.killpg(watcher.pid, signal.SIGINT)
    _, stderr = watcher.communicate(timeout=30)
    assert any(said.group(1) in line for line in seen), "".join(seen)[-3000:]
    assert "Traceback" not in stderr, stderr
    assert status(handle, project, ct_home)["state"] == "running", "still running when the README says to preempt"
    preempted = bash(preempt, handle)
    assert preempted.returncode == 0, preempted.stderr
    waited = bash(wait, handle)
    assert waited.returncode == 0, (waited.stdout, waited.stderr)
    final = status(handle, project, ct_home)
    assert final["state"] == "succeeded" and final["restarts"] == 1, final
    starts = [int(m) for m in re.findall(r"start_step=(\d+)", bash(merged, handle).stdout)]
    step = int(said.group(1).rsplit(" ", 1)[1])
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= step, starts
    assert f"steps={12 * STEPS_PER_EPOCH}" in run(["logs", handle], project, ct_home, None).stdout
