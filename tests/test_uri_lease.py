"""One live job per checkpoint URI (issue 50.5). Two jobs of different names given the same --checkpoint-uri at once
published into the same step folders, and each one's retention deleted the other's checkpoints. Now node 0 of a job
holds the URI's writer lease (cloudtrain/checkpoint/writer.py). Submit and node 0's start refuse a URI that a live
job of another lineage holds (exit 2, naming it and the fixes), and --take-over takes it. Every write into a step
folder checks the lease, and retention deletes only its own lineage's steps. The local jobs themselves are in
tests/test_uri_lease_jobs.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloudtrain import contract, storage
from cloudtrain.checkpoint import lineage, writer
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import step_dir
from cloudtrain.checkpoint.retention import apply_retention
from cloudtrain.sdk import Job
from tests.conftest import wait_for

STORES = ["file", "s3", "gs"]  # the issue's: file://, S3 (moto) and GCS (the emulator)


def hold(uri: str, job: str, line: str, take_over: bool = False, said: list[str] | None = None,
         lost: list[str] | None = None) -> writer.Holder:
    """Node 0 of ``job`` taking the URI's lease (settling briefly: the emulators agree at once)."""
    return writer.Holder(uri, writer.Identity(job, line, take_over), platform="local",
                         log=(said if said is not None else []).append,
                         on_lost=lost.append if lost is not None else None, settle=0.05).start()


def publish(uri: str, step: int, root: Path, line: str | None = None, text: str = "w") -> None:
    folder = root / f"s{step}-{text}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "w.txt").write_text(f"{text} {step}")
    remote = storage.join(uri, step_dir(step))
    files = checkpoint_store.describe_and_upload(folder, ["w.txt"], remote)
    checkpoint_store.publish(remote, step, files, world_size=1, extra={"lineage": line} if line else None)


@pytest.mark.parametrize("store_root", STORES, indirect=True)
def test_a_live_job_of_another_lineage_holds_the_uri_until_it_ends(store_root: str) -> None:
    uri = storage.join(store_root, "ckpt")
    first = hold(uri, "alpha-1", "alpha-aaaa")
    assert first.claimed() is None
    with pytest.raises(writer.UriHeld) as refused:  # submit: before anything is staged
        writer.before_submit(uri, writer.Identity("beta-1", "beta-bbbb"))
    text = refused.value.render()
    assert "held by another job: job alpha-1 (lineage alpha-aaaa, on local" in text, text
    assert "renewed 0s ago" in text and "--checkpoint-uri" in text and "--take-over" in text, text
    assert "`cloudtrain cancel local://alpha-1`" in text, text
    assert refused.value.exit_code == contract.EXIT_USAGE

    raced = hold(uri, "beta-1", "beta-bbbb")  # node 0 of a job whose submit raced the first's
    assert "held by another job: job alpha-1" in str(raced.claimed())
    raced.finish(release=True)  # refused: it gives up nothing
    assert writer.read(uri)["job"] == "alpha-1"  # type: ignore[index]

    first.finish(release=True)  # the job ended (succeeded, failed, cancelled): its lease goes at once
    assert writer.before_submit(uri, writer.Identity("beta-2", "beta-bbbb")) is None
    second = hold(uri, "beta-2", "beta-bbbb")
    assert second.claimed() is None
    second.finish(release=False)  # preempted: kept, to expire, for the job's restart
    held = writer.read(uri)
    assert held is not None and writer.live(held, time.time()) and held["job"] == "beta-2"
    restart = hold(uri, "beta-2", "beta-bbbb")  # the same job's restart takes it back at once
    assert restart.claimed() is None
    restart.finish(release=True)


@pytest.mark.parametrize("store_root", STORES, indirect=True)
def test_take_over_and_the_job_that_lost_the_uri_writes_no_more(store_root: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    uri = storage.join(store_root, "ckpt")
    lost: list[str] = []
    first = hold(uri, "alpha-1", "alpha-aaaa", lost=lost)
    assert first.claimed() is None
    note = writer.before_submit(uri, writer.Identity("beta-1", "beta-bbbb", take_over=True))
    assert note is not None and "--take-over" in note and "job alpha-1" in note
    said: list[str] = []
    second = hold(uri, "beta-1", "beta-bbbb", take_over=True, said=said)
    assert second.claimed() is None
    assert any("taken over from job alpha-1" in line for line in said), said

    # the first job's writes are refused from now on, in every process of it (node 0's sync, a rank's Checkpointer)
    monkeypatch.setenv(contract.JOB_ID, "alpha-1")
    monkeypatch.setenv(contract.LINEAGE, "alpha-aaaa")
    with pytest.raises(writer.UriHeld, match=r"was taken over by another job \(--take-over\), job beta-1"):
        publish(uri, 1, tmp_path, text="alpha")
    assert checkpoint_store.steps_present(uri) == set()  # refused before a byte was uploaded
    wait_for(lambda: bool(lost), timeout=10, interval=0.05)  # the refusal woke its node's lease: the node stops
    assert "was taken over by another job (--take-over), job beta-1" in lost[0], lost
    first.finish(release=True)  # lost: it gives nothing up
    assert writer.read(uri)["job"] == "beta-1"  # type: ignore[index]

    monkeypatch.setenv(contract.JOB_ID, "beta-1")
    monkeypatch.setenv(contract.LINEAGE, "beta-bbbb")
    publish(uri, 1, tmp_path, text="beta")
    second.finish(release=True)
    # lost for good: the first job writes nothing there even once the lease that replaced its own has ended
    writer._REFUSED.clear()  # a fresh process of the first job (a rank started later, a restart)
    monkeypatch.setenv(contract.JOB_ID, "alpha-1")
    with pytest.raises(writer.UriHeld):
        publish(uri, 2, tmp_path, text="alpha")
    restarted = hold(uri, "alpha-1", "alpha-aaaa")
    assert "was taken over" in str(restarted.claimed())
    assert [c.manifest["lineage"] for c in checkpoint_store.list_complete(uri)] == ["beta-bbbb"]


@pytest.mark.parametrize("store_root", STORES, indirect=True)
def test_a_resubmit_racing_its_own_restart_is_one_writer(store_root: str) -> None:
    """The same lineage is never refused; of two runs of one job the newest submission writes, and the restart of
    the run it replaced (a preemption's, on the local provider or a platform) stands aside."""
    uri = storage.join(store_root, "ckpt")
    lost: list[str] = []
    run = hold(uri, "train-1", "train-cccc", lost=lost)
    assert run.claimed() is None
    note = writer.before_submit(uri, writer.Identity("train-2", "train-cccc"))  # never refused: said
    assert note is not None and "another run of this job, job train-1" in note
    resubmit = hold(uri, "train-2", "train-cccc")
    assert resubmit.claimed() is None
    restart = hold(uri, "train-1", "train-cccc")  # the first run's node, restarted after a preemption
    assert "was taken over by a later submission of this job, job train-2" in str(restart.claimed())
    run.wake()  # its next renewal finds the lease taken: that run stops
    wait_for(lambda: bool(lost), timeout=10, interval=0.05)
    assert "a later submission of this job" in lost[0]
    resubmit.finish(release=False)  # the newest submission preempted: its own restart takes the lease back
    again = hold(uri, "train-2", "train-cccc")
    assert again.claimed() is None
    again.finish(release=True)
    assert writer.read(uri)["after"] == ["train-1"]  # type: ignore[index]


def test_a_renewal_that_fails_is_said_and_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    said: list[str] = []
    lost: list[str] = []
    node = hold(uri, "alpha-1", "alpha-aaaa", said=said, lost=lost)
    assert node.claimed() is None
    real = lineage.write
    failing = [OSError("store unreachable")] * 2

    def write(target: str, data: dict) -> None:
        if failing:
            raise failing.pop()
        real(target, data)

    monkeypatch.setattr(lineage, "write", write)
    for _ in range(3):
        node._turn(first=False)  # as the renewal thread does every RENEW_SECONDS
    assert node.lost is None and not lost  # training never fails because a renewal hiccuped
    assert sum("renewing the lease" in line and "store unreachable" in line for line in said) == 2, said
    assert any("renewed again, after 2 failure(s)" in line for line in said), said
    node.finish(release=True)
    assert not writer.live(writer.read(uri), time.time())


@pytest.mark.parametrize("store_root", STORES, indirect=True)
def test_retention_deletes_only_its_own_lineages_steps(store_root: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproduction 5's second half: each job's retention deleted the other's checkpoints."""
    uri = storage.join(store_root, "ckpt")
    publish(uri, 1, tmp_path)  # written before lineages existed: this job's, as before
    for step in (2, 3, 4):
        publish(uri, step, tmp_path, "alpha-aaaa")
    for step in (5, 6, 7):
        publish(uri, step, tmp_path, "beta-bbbb")
    storage.store_for(uri).delete([storage.join(uri, step_dir(3), "w.txt")])  # alpha's, not whole: still alpha's
    monkeypatch.setenv(contract.LINEAGE, "beta-bbbb")
    assert apply_retention(uri, keep=2) == [1, 5]
    left = {c.step: c.manifest.get("lineage") for c in checkpoint_store.list_complete(uri, log=lambda _m: None)}
    assert left == {2: "alpha-aaaa", 4: "alpha-aaaa", 6: "beta-bbbb", 7: "beta-bbbb"}
    assert 3 in checkpoint_store.steps_present(uri)
    assert apply_retention(uri, keep=2, lineage="alpha-aaaa") == [3]  # alpha's own retention: its partial goes
    assert sorted(checkpoint_store.steps_present(uri)) == [2, 4, 6, 7]


def test_take_over_is_planned_not_read(tmp_path: Path) -> None:
    """A plan is pure: --take-over reaches the nodes and the plan says what submit does; no store is read."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    uri = (tmp_path / "ckpt").as_uri()
    job = Job(script="train.py", source_dir=str(tmp_path), checkpoint={"uri": uri, "take_over": True})
    with job.plan("local") as plan:
        assert all(node.env[contract.TAKE_OVER] == "1" for node in plan.nodes)
        assert any("checkpoint.take_over" in note and "submit reads who holds it" in note for note in plan.notes)
    with Job(script="train.py", source_dir=str(tmp_path), checkpoint={"uri": uri}).plan("local") as plan:
        assert all(contract.TAKE_OVER not in node.env for node in plan.nodes)
    assert not (tmp_path / "ckpt").exists()
