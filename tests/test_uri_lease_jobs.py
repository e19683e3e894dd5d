"""Issue 50, reproduction 5, with real local jobs. Two jobs of different names were given the same --checkpoint-uri
at once. Both published into the same step folders, each one's retention deleted the other's, and the store ended
with one job's steps. Now the second submit is refused (exit 2, naming the first and the fixes), and nothing of it
is recorded or started. With --take-over it writes there, and the first job's next publish is refused: that job
fails saying why. Once the first job is gone (cancelled: its lease is released), the second one runs. The lease
rules themselves are in tests/test_uri_lease.py."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.testing.fixtures import stop_every_job
from tests.conftest import wait_for
from tests.support import Cloudtrain

# Writes two step folders, published when the script ends (sync_dir: a folder is complete at exit); with
# --wait-for PATH it first waits for that file, holding the URI meanwhile.
SCRIPT = """\
import os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
if sys.argv[1:2] == ["--wait-for"]:
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.05)
for step in (1, 2):
    (ckpt / f"step-{step}").mkdir(parents=True, exist_ok=True)
    (ckpt / f"step-{step}" / "w.txt").write_text(os.environ["CLOUDTRAIN_JOB_ID"])
"""


@pytest.fixture
def ct(tmp_path: Path) -> Iterator[Cloudtrain]:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(SCRIPT)
    yield Cloudtrain(tmp_path / "home", tmp_path / "proj")
    stop_every_job(tmp_path / "home")


def node_log(ct: Cloudtrain, handle: str) -> str:
    path = ct.home / "jobs" / handle.split("://", 1)[1] / "node-0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def holding(ct: Cloudtrain, uri: str, name: str, go: Path) -> str:
    """A job of ``name`` that holds ``uri`` until ``go`` exists (its node 0 takes the lease before torchrun)."""
    handle = ct("submit", "train.py", "--name", name, "--checkpoint-uri", uri, "--procs-per-node", "1", "--detach",
                "--", "--wait-for", str(go)).stdout.strip()
    wait_for(lambda: "torchrun: " in node_log(ct, handle), timeout=90, interval=0.1)
    return handle


def submit(ct: Cloudtrain, uri: str, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return ct("submit", "train.py", "--name", name, "--checkpoint-uri", uri, "--procs-per-node", "1", *flags,
              check=False)


@pytest.mark.parametrize("store_root", ["file", "s3", "gs"], indirect=True)
def test_a_second_job_on_a_held_checkpoint_uri_is_refused_or_takes_it_over(ct: Cloudtrain, store_root: str,
                                                                            tmp_path: Path) -> None:
    uri = storage.join(store_root, "shared")
    alpha = holding(ct, uri, "alpha", tmp_path / "go")

    refused = submit(ct, uri, "beta")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = refused.stderr
    assert f"held by another job: job {alpha.split('://')[1]} (lineage alpha-" in said, said
    assert f"`cloudtrain cancel {alpha}`" in said and "--checkpoint-uri" in said and "--take-over" in said, said
    assert "Traceback" not in said
    assert [job["handle"] for job in json.loads(ct("list", "-o", "json").stdout)] == [alpha]  # nothing of beta

    took = submit(ct, uri, "beta", "--take-over")  # in the foreground, until it ends
    assert took.returncode == 0, took.stdout[-3000:] + took.stderr[-2000:]
    assert "--take-over" in took.stderr and "taken over from job alpha-" in took.stdout
    (tmp_path / "go").touch()  # alpha saves now, into the URI it lost
    assert ct("wait", alpha, "--timeout", "120", check=False).returncode == 1
    status = ct.status(alpha)
    assert status["state"] == "failed"
    assert "taken over by another job (--take-over), job beta-" in json.dumps(status), status
    # the store holds beta's two checkpoints, whole: alpha wrote nothing into them
    found = checkpoint_store.list_complete(uri, log=lambda _m: None)
    assert [(c.step, c.manifest["lineage"].split("-")[0]) for c in found] == [(1, "beta"), (2, "beta")]
    for checkpoint in found:
        text = storage.read_bytes(storage.join(checkpoint.uri, "w.txt")).decode()
        assert text.startswith("beta-"), text


def test_once_the_first_job_is_cancelled_the_second_one_runs(ct: Cloudtrain, tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    alpha = holding(ct, uri, "alpha", tmp_path / "go")
    assert submit(ct, uri, "beta", "--detach").returncode == 2
    ct("cancel", alpha)
    ct("wait", alpha, "--timeout", "60", check=False)
    lease = json.loads(storage.read_bytes(storage.join(uri, "_cloudtrain", "writer.json")))
    assert lease["expires"] < time.time(), lease  # given up as its node ended
    ran = submit(ct, uri, "beta")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    found = checkpoint_store.list_complete(uri, log=lambda _m: None)
    assert [c.manifest["lineage"].split("-")[0] for c in found] == ["beta", "beta"]
