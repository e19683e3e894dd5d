"""A checkpoint a restart cannot load is never restored twice (issue 50): a start whose workers fail after restoring
checkpoint N, before any progress, sets N aside in the store (never restored, never deleted), and the next start
(a restart within max_restarts, or the next submit) restores the one before it, or starts from scratch, saying which
and why; a failure that follows the script is not laid at a checkpoint's door. `cloudtrain checkpoints` lists a
store's checkpoints and `submit --restore-from N` picks one on purpose."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.retention import apply_retention
from tests.node_support import REPO, make_bundle, node_env
from tests.support import Cloudtrain

# a plain script that saves a pair of files and, told to resume, needs both (as a model and its optimizer)
PAIR = '''
import os, sys
if os.environ.get("FAIL_AT_START"):
    raise RuntimeError("this script is broken whatever it loads")
step = 0
if "--resume" in sys.argv:
    step = int(open("ckpt/model.txt").read())
    assert int(open("ckpt/optim.txt").read()) == step
    print("resumed from step", step, flush=True)
os.makedirs("ckpt", exist_ok=True)
for name in ("model.txt", "optim.txt"):
    with open(os.path.join("ckpt", name), "w") as f:
        f.write(str(step + 1))
print("done step", step + 1, flush=True)
'''


def publish(tmp: Path, uri: str, step: int, files: dict[str, str]) -> None:
    """A snapshot of the script's folder, as the node publishes one (layout "dir")."""
    root = tmp / f"made-{step}"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    folder = storage.join(uri, checkpoint_store.step_dir(step))
    entries = checkpoint_store.describe_and_upload(root, sorted(files), folder, log=lambda _m: None)
    checkpoint_store.publish(folder, step, entries, world_size=0, kind="snapshot", log=lambda _m: None,
                             extra={"layout": "dir", "entries": sorted(files)})


def states(uri: str) -> dict[int, str]:
    """Each checkpoint's state, from what the store holds: its manifest, and a set-aside marker beside it."""
    aside = {int(rel.split("/")[0].removeprefix("step-")) for rel in
             (o.removeprefix(uri.rstrip("/") + "/") for o in storage.store_for(uri).list(uri))
             if rel.startswith("step-") and rel.split("/")[-1].startswith("set-aside-")}
    return {c.step: "set aside" if c.step in aside else "usable"
            for c in checkpoint_store.complete_among(uri, checkpoint_store.objects_by_step(uri), lambda _m: None)
            } | {step: "set aside" for step in aside}


def job(tmp_path: Path) -> tuple[Cloudtrain, list[str], str]:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pair.py").write_text(PAIR)
    uri = (tmp_path / "store").as_uri()
    return Cloudtrain(tmp_path / "home", tmp_path), ["submit", str(tmp_path / "proj" / "pair.py"), "--checkpoint-uri",
                                                      uri, "--checkpoint-dir", "ckpt", "--resume-arg=--resume"], uri


def test_a_checkpoint_the_script_cannot_load_is_set_aside_and_the_next_submit_restores_the_one_before(
        tmp_path: Path) -> None:
    ct, submit, uri = job(tmp_path)
    publish(tmp_path, uri, 1, {"model.txt": "5", "optim.txt": "5"})
    publish(tmp_path, uri, 2, {"model.txt": "10"})  # a subset of a save: optim.txt never made it

    failed = ct(*submit, check=False)  # no restarts: the job fails, and says what the next start does
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out[-3000:]
    assert "No such file or directory: 'ckpt/optim.txt'" in out
    assert (f"checkpoint 2 under {uri} is set aside: the start that restored it failed before any progress "
            "(FileNotFoundError") in out and "the next start restores checkpoint 1" in out, out[-3000:]
    assert states(uri) == {1: "usable", 2: "set aside"}

    again = ct(*submit)  # every later start reads the marker: the resubmission resumes from checkpoint 1
    out = again.stdout + again.stderr
    assert f"checkpoint 2 under {uri} is set aside (a start that restored it failed before any progress: " \
           "FileNotFoundError" in out and "): restoring checkpoint 1" in out, out[-3000:]
    assert "resumed from step 5" in out and "done step 6" in out
    assert "warning: checkpoint 2 under" in out  # the job's status says it too

    handle = re.search(r"submitted (local://\S+)", out).group(1)  # type: ignore[union-attr]
    listed = json.loads(ct("checkpoints", uri, "-o", "json").stdout)
    assert json.loads(ct("checkpoints", handle, "-o", "json").stdout) == listed  # a job's: its store's
    by_step = {row["step"]: row for row in listed["checkpoints"]}
    assert by_step[2]["state"] == "set aside" and "FileNotFoundError" in by_step[2]["why"]
    assert by_step[1]["state"] == "usable" and listed["resumes"] == max(s for s, r in by_step.items()
                                                                        if r["state"] == "usable")

    # picked on purpose: a step the store lacks is refused before anything is sent; an existing one is restored,
    # the newer usable ones set aside (not deleted), so restarts and later submissions go on from it
    refused = ct(*submit, "--restore-from", "9", check=False)
    assert refused.returncode == 2 and "there is no checkpoint 9 under" in refused.stderr, refused.stderr
    before = states(uri)
    picked = ct(*submit, "--restore-from", "1")
    assert "resumed from step 5" in picked.stdout + picked.stderr
    assert all(state == "set aside" for step, state in states(uri).items() if step in before and step > 1)


def test_a_restart_after_the_only_checkpoint_was_set_aside_starts_from_scratch_saying_so(tmp_path: Path) -> None:
    ct, submit, uri = job(tmp_path)
    publish(tmp_path, uri, 1, {"model.txt": "5"})
    done = ct(*submit, "--max-restarts", "1")  # the first start fails on it; the restart, within max_restarts, not
    out = done.stdout + done.stderr
    assert "restart 1 after checkpoint 1 was set aside" in out, out[-3000:]
    assert f"checkpoint 1 under {uri} is set aside (a start that restored it failed before any progress: " \
           "FileNotFoundError" in out and "no checkpoint before it; starting from scratch" in out, out[-3000:]
    assert "done step 1" in out.split("restart 1 after")[1]
    assert states(uri)[1] == "set aside"


def test_a_script_that_fails_whatever_it_loads_does_not_set_aside_checkpoint_after_checkpoint(tmp_path: Path) -> None:
    ct, submit, uri = job(tmp_path)
    publish(tmp_path, uri, 1, {"model.txt": "5", "optim.txt": "5"})
    publish(tmp_path, uri, 2, {"model.txt": "10", "optim.txt": "10"})
    failed = ct(*submit, "--max-restarts", "3", "--env", "FAIL_AT_START=1", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out[-3000:]
    # the start from 2 set it aside; the start from 1 failed the same way: the script's failure, 2 is usable again
    assert "restart 1 after checkpoint 2 was set aside" in out and "restart 2" not in out, out[-3000:]
    assert "the start from checkpoint 1 failed as the start from checkpoint 2 did" in out, out[-3000:]
    assert states(uri) == {1: "usable", 2: "usable"}


CHECKPOINTER = '''
import sys
import torch
import torch.distributed as dist
from cloudtrain.runtime import Checkpointer

dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8 if sys.argv[1] != "wrong" else 4)  # "wrong": a model the checkpoint does not fit
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = Checkpointer(model, opt, uri=sys.argv[2])  # a store of its own: the node restores nothing
print("resumed at %d" % ckpt.restore(), flush=True)
if sys.argv[1] == "seed":
    ckpt.save(3, block=True)
ckpt.close(save=False)
dist.destroy_process_group()
'''


def test_a_checkpointers_own_checkpoint_its_load_fails_on_is_set_aside_and_skipped(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    bundle = make_bundle(tmp_path, CHECKPOINTER)

    def node(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle", str(bundle),
                               "--workdir", str(tmp_path / f"work-{name}"), "--script", "train.py",
                               "--nproc-per-node", "1", "--", name, store],
                              env=node_env(tmp_path, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                              timeout=300)

    assert node("seed").returncode == 0
    wrong = node("wrong")
    out = wrong.stdout + wrong.stderr
    assert wrong.returncode != 0 and f"checkpoint 3 under {store} is set aside: the start that restored it failed " \
                                       "before any progress" in out, out[-3000:]
    assert states(store) == {3: "set aside"}
    said: list[str] = []  # what every Checkpointer's restore does (restore_latest): it passes over it, saying why
    assert checkpoint_restore.restore_latest(store, tmp_path / "again", log=said.append) is None
    assert any("checkpoint 3 under" in line and "starting from scratch" in line for line in said), said


@pytest.mark.parametrize("scheme", ["file", "s3"])
def test_checkpoints_lists_usable_set_aside_corrupt_and_incomplete(scheme: str, tmp_path: Path, emulators,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.checkpoint import set_aside
    from tests.emulators import ensure, root_uri

    ensure(scheme, emulators, tmp_path, monkeypatch)
    uri = root_uri(scheme, tmp_path)
    for step in (1, 2, 3, 4):
        publish(tmp_path, uri, step, {"model.txt": str(step), "optim.txt": str(step)})
    found = {c.step: c for c in checkpoint_store.list_complete(uri, log=lambda _m: None)}
    set_aside.set_aside(found[2], set_aside.FAILED, "a start that restored it failed: KeyError: 'optim'")
    checkpoint_store.quarantine(found[3], "model.txt: sha256 differs")
    store = storage.store_for(uri)
    store.delete([storage.join(found[4].uri, "optim.txt")])
    storage.write_bytes(storage.join(uri, "step-000000005", "model.txt"), b"5")

    ct = Cloudtrain(tmp_path / "home", tmp_path)
    listed = json.loads(ct("checkpoints", uri, "-o", "json").stdout)
    rows = {row["step"]: (row["state"], row["why"]) for row in listed["checkpoints"]}
    assert rows == {5: ("partial", "no manifest: being written, or a save cut short"),
                    4: ("incomplete", "missing 1 file(s) (optim.txt ...)"),
                    3: ("corrupt", "found corrupt by a restore: model.txt: sha256 differs"),
                    2: ("set aside", "a start that restored it failed: KeyError: 'optim'"), 1: ("usable", "")}
    assert listed["resumes"] == 1
    text = ct("checkpoints", uri).stdout
    assert "usable *" in text and "set aside" in text and f"{uri}: a restore takes checkpoint 1 (*)" in text


def test_retention_never_deletes_a_checkpoint_set_aside(tmp_path: Path) -> None:
    from cloudtrain.checkpoint import set_aside

    uri = (tmp_path / "store").as_uri()
    for step in range(1, 6):
        publish(tmp_path, uri, step, {"model.txt": str(step)})
    set_aside.set_aside(checkpoint_store.list_complete(uri, log=lambda _m: None)[1], set_aside.FAILED, "why")
    assert apply_retention(uri, keep=2, log=lambda _m: None) == [1, 3]
    assert states(uri) == {2: "set aside", 4: "usable", 5: "usable"}


def test_restore_from_lifts_the_one_picked_and_sets_aside_the_newer_ones(tmp_path: Path) -> None:
    from cloudtrain.checkpoint import set_aside
    from cloudtrain.checkpoint.restore_from import choose
    from cloudtrain.errors import UserError

    uri = (tmp_path / "store").as_uri()
    for step in (1, 2, 3):
        publish(tmp_path, uri, step, {"model.txt": str(step)})
    set_aside.set_aside(checkpoint_store.list_complete(uri, log=lambda _m: None)[1], set_aside.FAILED, "why")
    said: list[str] = []
    assert choose(uri, 2, log=said.append) == {"step": 2, "lifted": True, "passed_over": [3]}
    assert states(uri) == {1: "usable", 2: "usable", 3: "set aside"}
    assert "checkpoint 2 under" in said[0] and "was set aside (why); picked on purpose" in said[0]
    with pytest.raises(UserError, match=r"there is no checkpoint 9 under .*usable there: 1, 2"):
        choose(uri, 9)
    assert choose(uri, 3)["lifted"] and states(uri)[3] == "usable"  # brought back the same way


def test_status_of_a_job_that_may_restart_names_the_checkpoint_it_passes_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.checkpoint import set_aside
    from cloudtrain.handles import JobHandle
    from cloudtrain.job_types import JobState, JobStatus
    from cloudtrain.jobs.submitted import with_restart_point

    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    uri = (tmp_path / "store").as_uri()
    for step in (1, 2):
        publish(tmp_path, uri, step, {"model.txt": str(step)})
    set_aside.set_aside(checkpoint_store.list_complete(uri, log=lambda _m: None)[1], set_aside.FAILED, "why")
    status = with_restart_point(JobStatus(JobHandle("local", "x"), "x", JobState.PREEMPTED, checkpoint_uri=uri))
    assert status.restart_resumes == f"from checkpoint 1 (model.txt) under {uri}; checkpoint 2 is set aside (why)"
