"""checkpoint.dir, resume_args and ${CLOUDTRAIN_*} in args (issue 27): what a plan refuses or says, and what a node
does with them. The stacks themselves: tests/test_byo_checkpoints.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, stop_every_job, wait_for
from tests.support import Cloudtrain


@pytest.fixture
def ct(tmp_path: Path) -> Iterator[Cloudtrain]:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    yield Cloudtrain(tmp_path / "home", tmp_path / "proj")
    stop_every_job(tmp_path / "home")


@pytest.mark.parametrize(("flags", "says"), [
    (["--checkpoint-dir", "."], "checkpoint.dir: is the source folder itself"),
    (["--checkpoint-dir", "../elsewhere"], "leads out of the script's working folder"),
    (["--checkpoint-dir", "outputs/ckpt"], "overlaps ./outputs"),
    (["--checkpoint-dir", "/tmp/shared-ckpt", "--nodes", "2"], "nodes of a local job share this machine"),
    (["--checkpoint-dir", "ckpt", "--", "--out=${HOME}/x"], "args[0] names ${HOME}, which no node sets"),
    (["--resume-arg=--from=${CLOUDTRAIN_NOPE}"], "resume_args[0] names ${CLOUDTRAIN_NOPE}"),
])
def test_bad_checkpoint_settings_are_refused_with_the_field(ct: Cloudtrain, flags: list[str], says: str) -> None:
    run = ct("plan", "train.py", "--provider", "local", "--checkpoint-uri", "file:///tmp/x", *flags, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr
    assert "checkpoint.dir" in run.stderr or "args[0]" in run.stderr


def test_plan_says_where_checkpoints_go_and_when_resume_args_apply(ct: Cloudtrain) -> None:
    (ct.cwd / "out").mkdir()
    (ct.cwd / "out" / "ckpt.pt").write_bytes(b"a local run's checkpoint")
    plan = json.loads(ct("plan", "train.py", "-p", "local", "--checkpoint-uri", "file:///tmp/store", "--checkpoint-dir",
                         "out", "--resume-arg=--init_from=resume", "-o", "json", "--", "--out_dir=$${LITERAL}").stdout)
    notes = "\n".join(plan["notes"])
    assert "writes them into out" in notes and "only on a node that restored a checkpoint" in notes
    assert plan["nodes"][0]["argv"][-1] == "--out_dir=$${LITERAL}"
    assert "--resume-arg=--init_from=resume" in plan["nodes"][0]["argv"]
    shipped = [f["path"] for f in plan["package"]["files"]]
    assert "train.py" in shipped and not [p for p in shipped if p.startswith("out/")]  # what the job writes
    without = json.loads(ct("plan", "train.py", "-p", "local", "--resume-arg=--resume", "-o", "json").stdout)
    assert any("resume_args (--resume) are never used" in n for n in without["notes"])


def test_node_variables_in_args_are_replaced_without_a_shell() -> None:
    from cloudtrain.node.prepare import expand_args as expand

    env = {"CLOUDTRAIN_CHECKPOINT_DIR": "/n/ckpt dir", "CLOUDTRAIN_NODE_RANK": "1"}
    assert expand(["--out_dir=${CLOUDTRAIN_CHECKPOINT_DIR}", "${CLOUDTRAIN_NODE_RANK}${CLOUDTRAIN_NODE_RANK}",
                   "$${CLOUDTRAIN_NODE_RANK}", "${model.name}", "$(rm -rf /)"], env) == [
        "--out_dir=/n/ckpt dir", "11", "${CLOUDTRAIN_NODE_RANK}", "${model.name}", "$(rm -rf /)"]


@pytest.mark.slow
def test_what_no_restart_would_have_is_named_and_a_restart_starts_empty(tmp_path: Path) -> None:
    """A torn checkpoint in the checkpoint folder and a snapshot.pt in the working folder: preempted, the job says
    it restarts from scratch, each node names what it leaves behind, and the restart starts with an empty checkpoint
    folder (as a new machine would), not with the torn file."""
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    (tmp_path / "proj").mkdir()
    script = tmp_path / "proj" / "leaves_files_behind.py"
    script.write_text((SCRIPTS / "leaves_files_behind.py").read_text())
    handle = ct("submit", str(script), "--checkpoint-uri", (tmp_path / "store").as_uri(), "--max-restarts", "1",
                "--detach").stdout.strip()
    wait_for(lambda: "ready" in ct.logs(handle), timeout=120, interval=0.3)
    preempted = ct("preempt", handle).stdout
    assert "from scratch: no checkpoint is published under" in preempted, preempted

    def restarted() -> str:
        return ct.logs(handle).partition("restart 1 after preemption")[2]

    wait_for(lambda: "ready" in restarted(), timeout=120, interval=0.3)
    first, _, second = ct.logs(handle).partition("restart 1 after preemption")
    assert re.search(r"not published \(it stays on this node only\): \S+ckpt\.pt \(ckpt\.pt is incomplete", first)
    assert "into its working folder (snapshot.pt)" in first
    assert "is set aside in" in second and "checkpoint folder holds []" in second

    ct("preempt", handle)
    assert ct("wait", handle, "--timeout", "120", check=False).returncode == 1
    status = ct("status", handle).stdout
    assert "a restart resumes from scratch: no checkpoint is published" in status, status
    assert "warning: not published" in status and "snapshot.pt" in status
    warnings = ct.status(handle)["nodes"][0]["warnings"]
    assert len(warnings) == 2, warnings


def saving_beside_its_folder(ct: Cloudtrain, tmp_path: Path, then: str) -> str:
    """A job whose script saves into ckpt/ while its checkpoint.dir says ckpts (a typo), then runs ``then``; returns
    its handle once node 0 has said the folder is empty."""
    (ct.cwd / "train.py").write_text("import os, time, torch\nos.makedirs('ckpt', exist_ok=True)\n"
                                     "torch.save({'w': 1}, 'ckpt/model.pt')\n" + then)
    handle = ct("submit", "train.py", "--checkpoint-uri", (tmp_path / "store").as_uri(), "--checkpoint-dir", "ckpts",
                "--set", "checkpoint.interval=2", "--detach").stdout.strip()
    wait_for(lambda: "is empty while the script wrote" in ct.logs(handle), timeout=120, interval=0.3)
    return handle


def test_a_checkpoint_folder_the_script_never_writes_is_said_while_it_runs_and_at_its_end(ct: Cloudtrain,
                                                                                          tmp_path: Path) -> None:
    """Issue 37.7/37.8: ``--checkpoint-dir ckpts`` for a script that saves into ``ckpt`` ended `succeeded` with an
    empty store and not a word; files left in the working folder were named only at a stop. Both are said while
    the job runs (the folder, after one interval) and at its end, in the log and in `status -o json`."""
    handle = saving_beside_its_folder(ct, tmp_path, "torch.save({'best': 1}, 'model_best.pth.tar')\ntime.sleep(6)\n")
    assert ct("wait", handle, "--timeout", "120", check=False).returncode == 0
    log = ct.logs(handle)
    assert re.search(r"checkpoint folder \S+ckpts is empty while the script wrote ckpt/model\.pt", log), log
    status = ct.status(handle)
    warnings = status["nodes"][0]["warnings"]
    assert any("ckpts is empty" in w and "checkpoint.dir" in w for w in warnings), warnings
    assert any("model_best.pth.tar" in w and "working folder" in w for w in warnings), warnings
    # the job's own line says it too: a job that published nothing never reads a plain "succeeded"
    assert status["state"] == "succeeded" and "ckpts is empty" in status["message"], status["message"]
    assert "more warning(s)" in status["message"]
    assert "ckpts is empty" in ct("status", handle).stdout.splitlines()[0]


def test_an_empty_checkpoint_folder_is_repeated_by_status_and_preempt_while_the_job_runs(ct: Cloudtrain,
                                                                                          tmp_path: Path) -> None:
    """Issue 50.7: the warning was in the node's log only, and only at the end in `status`: a user who looked at
    `status`, or preempted the job to rehearse a restart, was told it restarts from scratch and not why."""
    handle = saving_beside_its_folder(ct, tmp_path, "time.sleep(60)\n")
    status = ct("status", handle).stdout
    assert re.search(r"warning: the checkpoint folder \S+ckpts is empty while the script wrote ckpt/model\.pt",
                     status), status
    preempted = ct("preempt", handle).stdout
    assert "from scratch" in preempted and "ckpts is empty while the script wrote ckpt/model.pt" in preempted, \
        preempted


def _nothing_recorded(ct: Cloudtrain) -> None:
    assert json.loads(ct("list", "-o", "json").stdout) == []


@pytest.mark.parametrize(("flags", "files"), [
    (["train.py", "--checkpoint-dir", "model"], "model/__init__.py, model/net.py"),  # issue 38.1
    (["train.py", "--checkpoint-dir", "./model/"], "model/__init__.py, model/net.py"),
    (["exp/run.py", "--source-dir", ".", "--checkpoint-dir", "exp"], "exp/run.py (the script)"),  # issue 38.2
    (["-m", "model.net", "--checkpoint-dir", "model"], "model/net.py (the module)"),
    (["train.py", "--checkpoint-dir", "conf", "--set", "requirements=conf/requirements.txt"],
     "conf/requirements.txt (the requirements file), conf/train.yaml"),
    (["train.py", "--checkpoint-dir", "model/net.py"], "names the file model/net.py of the package"),
    (["train.py", "--checkpoint-dir", "train.py/ckpt"], "names the file train.py of the package"),
])
def test_a_checkpoint_folder_that_holds_what_the_job_runs_is_refused(ct: Cloudtrain, flags: list[str],
                                                                     files: str) -> None:
    """Issue 38.1/38.2: checkpoint.dir naming a folder of code the script imports planned fine, shipped train.py
    alone and failed on the node (`No module named 'model'`); one holding the script blamed a `package.exclude
    (/exp/)` rule the spec does not have, with a `!exp/` fix that changed nothing. Refused, naming the field, the
    files it would take away and the real fix; submit records nothing."""
    (ct.cwd / "train.py").write_text("from model.net import f\nf()\n")
    for rel, text in (("model/__init__.py", ""), ("model/net.py", "def f():\n    return 1\n"),
                      ("exp/run.py", "print('run')\n"), ("conf/requirements.txt", "numpy\n"),
                      ("conf/train.yaml", "lr: 0.1\n"), ("conf/last.pt", "a local run's checkpoint")):
        (ct.cwd / rel).parent.mkdir(exist_ok=True)
        (ct.cwd / rel).write_text(text)
    store = ["--checkpoint-uri", (ct.cwd.parent / "store").as_uri()]
    for command in ("plan", "submit"):
        run = ct(command, *flags, "-p", "local", *store, *(["--detach"] if command == "submit" else []), check=False)
        assert run.returncode == 2, run.stdout + run.stderr
        assert run.stderr.startswith("error: checkpoint.dir: ") and files in run.stderr, run.stderr
        assert "--checkpoint-dir checkpoints" in run.stderr and "Traceback" not in run.stderr
        assert "package.exclude" not in run.stderr and "!exp/" not in run.stderr
    _nothing_recorded(ct)
    assert not (ct.cwd.parent / "store").exists()


def test_a_local_runs_checkpoints_are_left_out_however_the_folder_is_spelled(ct: Cloudtrain) -> None:
    """`--checkpoint-dir ./out/` shipped out/ckpt.pt (the exclude was the text `/./out/`, which matches nothing);
    a local run's checkpoints in the folder are left out, said in the plan, whatever the spelling."""
    (ct.cwd / "out" / "step-1").mkdir(parents=True)
    (ct.cwd / "out" / "step-1" / "model.safetensors").write_bytes(b"weights")
    (ct.cwd / "out" / "latest").symlink_to("step-1")  # a link a trainer keeps to its newest: never judged
    for spelling in ("out", "./out/", "out/"):
        plan = json.loads(ct("plan", "train.py", "-p", "local", "--checkpoint-dir", spelling, "-o", "json").stdout)
        assert [f["path"] for f in plan["package"]["files"]] == ["train.py"], spelling
        assert any(n.startswith("package: left out out/ (checkpoint.dir") for n in plan["notes"]), plan["notes"]


@pytest.mark.parametrize(("flags", "says"), [
    (["--checkpoint-dir", "c" * 300], "checkpoint.dir: holds a name of 300 bytes"),  # issue 38.3
    (["--checkpoint-dir", "ckpt/" + "é" * 128], "checkpoint.dir: holds a name of 256 bytes"),  # bytes, not letters
    (["--checkpoint-dir", "/data/" + "d/" * 2100], "checkpoint.dir: is 4206 bytes long"),
    (["--env", "CLOUDTRAIN_OUTPUT_DIR=/out/" + "o" * 256], "env: CLOUDTRAIN_OUTPUT_DIR holds a name of 256 bytes"),
    (["-p", "slurm", "--set", "providers.slurm.staging=/shared/" + "s" * 256],
     "providers.slurm.staging: holds a name of 256 bytes"),
])
def test_a_folder_name_no_file_system_holds_is_refused_at_plan_time(ct: Cloudtrain, flags: list[str],
                                                                    says: str) -> None:
    """Issue 38.3: a 300-byte checkpoint folder name planned fine; the script trained to its end and the job failed
    `File name too long` at its first save. Names over 255 bytes and paths over 4095 are refused by the spec, for
    checkpoint.dir and the other folders a node writes (the output folder, Slurm's staging)."""
    run = ct("submit", "train.py", *(["-p", "local"] if "-p" not in flags else []), *flags, "--detach", check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert says in run.stderr and "no file system holds" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr) < 1000  # the 4,000-byte value is not echoed whole
    _nothing_recorded(ct)
