"""Bring your own trainer (issue 27): real training stacks, unmodified, writing checkpoints their own way, run as
local jobs with ``--checkpoint-dir`` and ``--resume-arg``. Each is preempted (SIGTERM) mid-run, then hard-killed
(SIGKILL, no final sync) while it saves, then submitted again: it resumes from its newest complete checkpoint, ends at
the same step (with the same weights where the stack's resume is exact) as the same script under bare torchrun, and
no torn file is ever published or restored. The scripts are in tests/scripts/byo/ (tiny models, data made there)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.home.procs import kill_tagged
from tests.conftest import SCRIPTS, stop_every_job, wait_for
from tests.support import Cloudtrain

# pytest-xdist: timing-sensitive, one at a time on one worker: each preempts a stack mid-run and kills it the moment
# it saves; two at once on two cores ran to their end before the preemption came
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("byo")]
BYO = SCRIPTS / "byo"
DONE = re.compile(r"\[byo\] done step (\d+) params (\w+)")
RESUMED = re.compile(r"\[byo\] resumed from step (\d+)")


@dataclass(frozen=True)
class Stack:
    script: str
    folder: str  # checkpoint.dir: where the stack writes, relative to the working folder
    args: tuple[str, ...]
    resume: str  # the stack's own way to resume, given as --resume-arg
    exact: bool = True  # resumed weights equal an uninterrupted run's (the stack restores all it needs)
    procs: int = 1
    slow: tuple[str, ...] = ("--step_sleep", "0.4")  # interrupted runs only: time to interrupt them mid-way


STACKS = {
    "nanogpt": Stack("nanogpt_style.py", "out", ("--out_dir=out", "--max_iters=24", "--eval_interval=4",
                                                 "--ckpt_mb=64"), "--init_from=resume", procs=2,
                     slow=("--step_sleep=0.4",)),
    "hf-trainer": Stack("hf_trainer.py", "out", ("--output_dir", "out", "--max_steps", "24", "--save_steps", "4"),
                        "--resume_from_checkpoint=true"),
    "lightning": Stack("lightning_ckpt.py", "ckpts", ("--ckpt_dir", "ckpts", "--max_steps", "24", "--every", "4"),
                       "--ckpt_path=last"),
    "accelerate": Stack("accelerate_ckpt.py", "proj", ("--project_dir", "proj", "--max_steps", "24",
                                                        "--save_every", "4"), "--resume"),
    # one process: two DDP processes with DCP on gloo can deadlock in their own teardown (~ProcessGroupGloo joins
    # gloo's thread while holding the GIL; seen under bare torchrun too), which is torch's, not what this tests
    "dcp": Stack("dcp_plain.py", "ckpt", ("--ckpt_dir", "ckpt", "--max_steps", "24", "--every", "4"),
                 "--resume"),
}


def project(tmp: Path, stack: Stack) -> Path:
    proj = tmp / "proj"
    proj.mkdir(parents=True, exist_ok=True)
    (proj / stack.script).write_text((BYO / stack.script).read_text())
    return proj / stack.script


def bare_torchrun(tmp: Path, stack: Stack) -> tuple[int, str]:
    """The script alone, as its own docs run it: the step and weights an uninterrupted run ends with."""
    script = project(tmp, stack)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(stack.procs),
                          script.name, *stack.args], cwd=script.parent, capture_output=True, text=True, timeout=300)
    # the environment as it is: a one-node cloudtrain job's worker gets what bare torchrun gives it (OMP_NUM_THREADS
    # only where torchrun sets it); forcing it here would compare weights summed on another number of threads
    done = DONE.search(run.stdout)
    # torch's own, seen once in ~10 suite runs: a gloo rank aborts in its teardown after the script's last line
    # ("terminate called without an active exception", SIGABRT), under bare torchrun: the result it printed stands
    torn_down = "terminate called without an active exception" in run.stderr
    assert done and (run.returncode == 0 or torn_down), run.stdout[-3000:] + run.stderr[-3000:]
    return int(done.group(1)), done.group(2)


def torn_files(uri: str) -> list[str]:
    """Files of complete checkpoints in the store whose own format says they were cut short."""
    torn = []
    for found in checkpoint_store.list_complete(uri, log=lambda _m: None):
        folder = Path(found.uri.removeprefix("file://"))
        torn += [f"{found.uri}/{f['path']}" for f in found.manifest["files"]
                 if checkpoint_snapshots.file_complete(folder / f["path"]) is False]
    return torn


def kill_while_it_saves(job_id: str, folder: Path, timeout: float = 120) -> None:
    """SIGKILL the node (no final sync: the machine is gone) the moment the stack starts its next save, seen as a
    new or growing file in its checkpoint folder: what a kill mid-save leaves is a torn file."""
    before = checkpoint_snapshots.scan(folder)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = checkpoint_snapshots.scan(folder)
        if any(before.get(rel) != state for rel, state in now.items()):
            break
        time.sleep(0.005)
    else:
        pytest.fail(f"no save seen in {folder}")
    kill_tagged(f"{job_id}/node-0", signal.SIGKILL)  # the node's bootstrap, torchrun and workers carry the tag


@pytest.fixture(autouse=True)
def _no_stray_jobs(tmp_path: Path) -> Iterator[None]:
    yield
    stop_every_job(tmp_path / "home")


@pytest.mark.parametrize("name", sorted(STACKS))
def test_stack_preempted_then_killed_mid_save_resumes_from_its_newest_complete_checkpoint(
        name: str, tmp_path: Path) -> None:
    stack = STACKS[name]
    expected = bare_torchrun(tmp_path / "bare", stack)
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    store = (tmp_path / "store").as_uri()
    script = project(tmp_path, stack)
    submit = ["submit", str(script), "--procs-per-node", str(stack.procs), "--checkpoint-uri", store,
              "--checkpoint-dir", stack.folder, f"--resume-arg={stack.resume}", "--env",
              "CLOUDTRAIN_CHECKPOINT_QUIET=0.5"]
    handle = ct(*submit, "--max-restarts", "1", "--detach", "--", *stack.args, *stack.slow).stdout.strip()
    job_id = handle.split("://", 1)[1]
    node = tmp_path / "home" / "jobs" / job_id / "node-0"

    def log() -> str:  # the node's log itself: a CLI call per look would be slower than the run under load
        path = node.parent / "node-0.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # 1. preempted once a checkpoint is in the store: the restart resumes from it, with the stack's own flag
    wait_for(lambda: "[cloudtrain] published" in log(), timeout=180, interval=0.05)
    ct("preempt", handle)
    wait_for(lambda: RESUMED.search(log().partition("restart 1 after preemption")[2]) is not None, timeout=180,
             interval=0.05)
    first_run, _, restarted = log().partition("restart 1 after preemption")
    first = int(RESUMED.search(restarted).group(1))  # type: ignore[union-attr]
    assert first > 0 and "resumed from step" not in first_run, log()[-3000:]
    assert stack.resume in restarted.split("torchrun:")[1].splitlines()[0]  # only the restart resumes
    assert stack.resume not in first_run.split("torchrun:")[1].splitlines()[0]

    # 2. hard-killed while the restarted run saves: nothing torn reaches the store
    kill_while_it_saves(job_id, node / "bundle" / "src" / stack.folder)
    assert ct("wait", handle, "--timeout", "60", check=False).returncode == 1
    assert torn_files(store) == []

    # 3. submitted again: resumes from the newest complete checkpoint and ends where bare torchrun ends
    again = ct(*submit, "--", *stack.args)
    out = again.stdout + again.stderr
    resumed = RESUMED.search(out)
    assert resumed and int(resumed.group(1)) >= first, out[-4000:]
    done = DONE.search(out)
    assert done and int(done.group(1)) == expected[0], out[-4000:]
    if stack.exact:
        assert done.group(2) == expected[1], f"weights differ from bare torchrun's: {out[-3000:]}"
    assert torn_files(store) == [] and "Traceback" not in out
