"""Issue 37.5/37.6: a multi-node job's checkpoint files written on nodes other than node 0 (DCP shards of their
ranks, the HF Trainer's rng_state_<rank>.pth) reach node 0's checkpoints through the store
(cloudtrain/checkpoint/parts.py). Node objects side by side in one process, over a real file:// store, with the
files the stacks write (torch.save's zip format); then real 2-node local jobs running plain DCP."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cloudtrain import storage
from cloudtrain.checkpoint import parts as checkpoint_parts
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.parts import PARTS, NodeParts, PartSync
from cloudtrain.errors import CloudtrainError
from tests.conftest import SCRIPTS, stop_every_job, wait_for
from tests.support import Cloudtrain


def save(path: Path, value: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.full((4,), value)}, path)


def dcp_files(folder: Path, ranks: range, metadata: bool) -> None:
    """What dcp.save leaves on one node: its ranks' shards, and on the node of rank 0 the .metadata written last."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        (folder / f"__{rank}_0.distcp").write_bytes(b"shard %d" % rank)
    if metadata:
        (folder / ".metadata").write_bytes(b"metadata")


def published(uri: str) -> list[tuple[int, list[str]]]:
    return [(c.step, sorted(f["path"] for f in c.manifest["files"])) for c in checkpoint_store.list_complete(uri)]


def nodes(tmp_path: Path, world_size: int = 2,
          uri: str | None = None) -> tuple[str, checkpoint_snapshots.Snapshotter, PartSync]:
    uri = uri or (tmp_path / "store").as_uri()
    (tmp_path / "node1").mkdir()
    other = PartSync(tmp_path / "node1", uri, node=1, quiet=0.0, thread=False)
    parts = NodeParts(uri, 2, tmp_path / ".node0.parts", final_wait=2.0)
    node0 = checkpoint_snapshots.Snapshotter(tmp_path / "node0", uri, keep=2, quiet=0.0, world_size=world_size,
                                             parts=parts)
    return uri, node0, other


def agreed(node0: checkpoint_snapshots.Snapshotter, node1: PartSync) -> int | None:
    """One multi-node publish: node 0 finds a snapshot whole on its side and asks the other nodes to look again,
    node 1 answers (uploading its part), node 0 publishes."""
    first = node0.poll()
    if first is not None:
        return first
    node1.poll()
    return node0.poll()


def test_a_dcp_folder_is_published_with_every_nodes_shards(tmp_path: Path) -> None:
    """37.5: each node holds its own ranks' shards. Before: node 0's folder never held rank 1's, so nothing was ever
    published (the job still read `succeeded`). Node 0 now waits for node 1's part, then publishes both."""
    uri, node0, node1 = nodes(tmp_path)
    dcp_files(tmp_path / "node0" / "step-4", range(0, 1), metadata=True)
    dcp_files(tmp_path / "node1" / "step-4", range(1, 2), metadata=False)
    assert node0.poll() is None  # node 1 has not uploaded its part: the checkpoint waits
    node1.poll()
    assert node0.poll() == 4
    assert published(uri) == [(4, ["step-4/.metadata", "step-4/__0_0.distcp", "step-4/__1_0.distcp"])]
    left = [u.rsplit(f"/{PARTS}/", 1)[1] for u in checkpoint_store.storage.store_for(uri).list(f"{uri}/{PARTS}")]
    assert left == ["ask.json", "node-1.json"], left  # the part is in the checkpoint now: gone from the store


def test_a_restart_restores_every_nodes_files_to_each_node(tmp_path: Path) -> None:
    """Restore gives each node the whole checkpoint (DCP reads what it needs; HF loads its own rng_state_<rank>)."""
    uri, node0, node1 = nodes(tmp_path)
    save(tmp_path / "node0" / "checkpoint-5" / "rng_state_0.pth", 0.0)
    save(tmp_path / "node0" / "checkpoint-5" / "optimizer.pt", 1.0)
    (tmp_path / "node0" / "checkpoint-5" / "trainer_state.json").write_text("{}")
    save(tmp_path / "node1" / "checkpoint-5" / "rng_state_1.pth", 1.0)
    node1.poll()
    assert node0.poll() is None  # the first save of the run: published once the next has begun, or at the end
    assert node1.finish() is None
    assert node0.poll(final=True) == 5
    for node in ("again0", "again1"):
        checkpoint_restore.restore_latest(uri, tmp_path / node)
        assert sorted(p.name for p in (tmp_path / node / "checkpoint-5").iterdir()) == [
            "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"]


def test_a_part_still_being_written_when_the_job_ends_publishes_nothing_new(tmp_path: Path) -> None:
    """37.6 at a preemption: node 1's rng_state_1.pth is cut short when the workers stop. A checkpoint is every
    node's files of one save: the previous checkpoint stands, and node 0 says which node's file held it back."""
    uri, node0, node1 = nodes(tmp_path)
    save(tmp_path / "node0" / "checkpoint-5" / "rng_state_0.pth", 0.0)
    (tmp_path / "node0" / "checkpoint-5" / "trainer_state.json").write_text("{}")
    save(tmp_path / "node1" / "checkpoint-5" / "rng_state_1.pth", 1.0)
    save(tmp_path / "node0" / "checkpoint-10" / "rng_state_0.pth", 0.0)
    (tmp_path / "node0" / "checkpoint-10" / "trainer_state.json").write_text("{}")
    save(tmp_path / "node1" / "checkpoint-10" / "rng_state_1.pth", 2.0)
    whole = (tmp_path / "node1" / "checkpoint-10" / "rng_state_1.pth").read_bytes()
    (tmp_path / "node1" / "checkpoint-10" / "rng_state_1.pth").write_bytes(whole[: len(whole) // 2])
    assert node0.poll() is None  # checkpoint-10 was begun, so checkpoint-5 is over here: has node 1 looked?
    node1.poll()
    assert node0.poll() == 5  # with node 1's part
    assert node1.finish() is None
    assert node0.poll(final=True) is None
    assert [step for step, _ in published(uri)] == [5]
    assert any("checkpoint-10" in line and "node 1" in line for line in node0.unpublished), node0.unpublished
    assert any("rng_state_1.pth is incomplete" in line for line in node1.unpublished()), node1.unpublished()


def test_a_node_that_wrote_nothing_into_a_folder_holds_nothing_back(tmp_path: Path) -> None:
    """HF, Lightning and nanoGPT save from global rank 0 only: node 1's index lists nothing, node 0 publishes alone."""
    uri, node0, node1 = nodes(tmp_path)
    save(tmp_path / "node0" / "checkpoint-3" / "model.pt", 3.0)
    save(tmp_path / "node0" / "checkpoint-6" / "model.pt", 6.0)
    assert node0.poll() is None  # checkpoint-3's save is over here: node 0 asks whether node 1 holds part of it
    node1.poll()  # node 1 looks after it read the question, and lists nothing
    assert node0.poll() == 3 and published(uri) == [(3, ["checkpoint-3/model.pt"])]


def test_an_index_of_another_shape_is_no_index(tmp_path: Path) -> None:
    """A store is shared: a hand-written or foreign node-1.json is read as no word from node 1, never a traceback."""
    uri = (tmp_path / "store").as_uri()
    (tmp_path / "store" / PARTS).mkdir(parents=True)
    for junk in (b"[1, 2]", b"{\"entries\": [\"a\"]}", b"not json", b"{\"entries\": {\"a\": 3}}"):
        (tmp_path / "store" / PARTS / "node-1.json").write_bytes(junk)
        assert checkpoint_parts.read_index(uri, 1) is None
    _found, problems = NodeParts(uri, 2, tmp_path / "s").gather(["step-1"], final=False)
    assert "node 1 said nothing" in problems["step-1"]


def test_other_nodes_files_are_copied_in_the_store_never_through_node_0(
        store_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 downloaded each other node's part and uploaded it again: at 8 nodes, 7/8 of every save through one
    node's network link, twice. Every built-in store copies objects itself now (S3 CopyObject, GCS rewrite, Azure
    Copy Blob, a hard link on file://): node 0 reads only the part's manifest, and the checkpoint restores whole."""
    assert storage.copier(store_root) is not None

    def no_download(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("node 0 downloaded another node's part")

    monkeypatch.setattr(checkpoint_parts, "fetch_objects", no_download)
    uri, node0, node1 = nodes(tmp_path, uri=storage.join(store_root, "job"))
    shard = os.urandom(3_000_000)
    dcp_files(tmp_path / "node0" / "step-4", range(0, 1), metadata=True)
    (tmp_path / "node1" / "step-4").mkdir(parents=True)
    (tmp_path / "node1" / "step-4" / "__1_0.distcp").write_bytes(shard)
    assert agreed(node0, node1) == 4
    assert published(uri) == [(4, ["step-4/.metadata", "step-4/__0_0.distcp", "step-4/__1_0.distcp"])]
    assert not (tmp_path / ".node0.parts").exists()  # nothing of node 1's came here
    left = [u.rsplit(f"/{PARTS}/", 1)[1] for u in storage.store_for(uri).list(storage.join(uri, PARTS))]
    assert left == ["ask.json", "node-1.json"], left  # the part itself is gone; its copy in the checkpoint stands
    checkpoint_restore.restore_latest(uri, tmp_path / "again")
    assert (tmp_path / "again" / "step-4" / "__1_0.distcp").read_bytes() == shard


@pytest.mark.parametrize("store_root", ["file", "s3"], indirect=True)
def test_a_part_a_later_checkpoint_needs_again_is_copied_from_the_checkpoint_that_holds_it(
        store_root: str, tmp_path: Path) -> None:
    """An entry node 1 wrote once and left alone is in every later snapshot, but its part left the store with the
    first publish. Node 0 used to keep its download for that; copied in the store, the next checkpoint copies node
    1's files from the checkpoint that holds them (every later publish failed: the part was gone)."""
    uri, node0, node1 = nodes(tmp_path, uri=storage.join(store_root, "job"))
    node0.set.declared = checkpoint_snapshots.save_sets.Declared(["checkpoint-*/model.pt"])  # each save is that file
    save(tmp_path / "node0" / "checkpoint-5" / "model.pt", 5.0)
    save(tmp_path / "node0" / "extra" / "rank0.pt", 0.0)
    save(tmp_path / "node1" / "extra" / "rank1.pt", 1.0)
    assert agreed(node0, node1) == 5
    save(tmp_path / "node0" / "checkpoint-10" / "model.pt", 10.0)
    assert agreed(node0, node1) == 10
    assert published(uri)[-1] == (10, ["checkpoint-10/model.pt", "extra/rank0.pt", "extra/rank1.pt"])
    checkpoint_restore.restore_latest(uri, tmp_path / "again")
    assert torch.load(tmp_path / "again" / "extra" / "rank1.pt")["w"].tolist() == [1.0] * 4


def test_a_part_whose_files_do_not_match_its_manifest_is_not_taken(tmp_path: Path) -> None:
    """Copied in the store, a file of another size than its part's manifest says stops the publish."""
    uri, node0, node1 = nodes(tmp_path)
    dcp_files(tmp_path / "node0" / "step-4", range(0, 1), metadata=True)
    dcp_files(tmp_path / "node1" / "step-4", range(1, 2), metadata=False)
    assert node0.poll() is None  # asks node 1
    node1.poll()
    shard = next((tmp_path / "store" / PARTS).rglob("__1_0.distcp"))
    shard.write_bytes(b"tampered")
    with pytest.raises(CloudtrainError, match=r"__1_0\.distcp holds 8 bytes, its description 7"):
        node0.poll()
    assert published(uri) == []


def test_a_store_that_cannot_copy_has_each_part_downloaded_and_verified(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store plugin without copy(): node 0 downloads the part, checks every sha256 against the part's manifest,
    and a part that does not match is not taken (the previous checkpoint stands)."""
    monkeypatch.setattr(checkpoint_parts.storage, "copier", lambda _uri: None)
    uri, node0, node1 = nodes(tmp_path)
    dcp_files(tmp_path / "node0" / "step-4", range(0, 1), metadata=True)
    dcp_files(tmp_path / "node1" / "step-4", range(1, 2), metadata=False)
    assert node0.poll() is None  # asks node 1
    node1.poll()
    shard = next((tmp_path / "store" / PARTS).rglob("__1_0.distcp"))
    shard.write_bytes(b"shard 9")  # the same size, other bytes
    assert node0.poll() is None and published(uri) == []
    shard.write_bytes(b"shard 1")
    assert node0.poll() == 4
    assert published(uri) == [(4, ["step-4/.metadata", "step-4/__0_0.distcp", "step-4/__1_0.distcp"])]
    assert (tmp_path / "store" / "step-000000004" / "step-4" / "__1_0.distcp").read_bytes() == b"shard 1"


@pytest.fixture
def _no_stray_jobs(tmp_path: Path) -> Iterator[None]:
    yield
    stop_every_job(tmp_path / "home")


DONE = re.compile(r"\[byo\] done step (\d+) params (\w+)")
RESUMED = re.compile(r"\[byo\] resumed from step (\d+)")


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "store_root"), [("checkpoint-dir", "file"), ("default", "file"),
                                                    ("checkpoint-dir", "s3")], indirect=["store_root"])
def test_a_two_node_dcp_job_publishes_and_resumes_from_both_nodes_shards(
        layout: str, store_root: str, tmp_path: Path, _no_stray_jobs: None) -> None:
    """37.5 end to end: plain DCP (torchtitan's layout) on 2 nodes x 1 process. Before: nothing was published (the
    checkpoint-dir layout) or node 0's half of each step folder was (the default layout), and the job read
    `succeeded`. Now every step's checkpoint holds both shards and .metadata, and a second submission resumes from
    the newest and trains on. On S3 (moto) node 1's shard reaches each checkpoint by CopyObject."""
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    store = storage.join(store_root, "ckpt")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "dcp_plain.py").write_text((SCRIPTS / "byo" / "dcp_plain.py").read_text())
    folder = ["--checkpoint-dir", "ckpt"] if layout == "checkpoint-dir" else []
    ckpt = "ckpt" if folder else "${CLOUDTRAIN_CHECKPOINT_DIR}"
    submit = ["submit", str(proj / "dcp_plain.py"), "--nodes", "2", "--procs-per-node", "1", "--checkpoint-uri",
              store, *folder, "--resume-arg=--resume", "--env", "CLOUDTRAIN_CHECKPOINT_QUIET=0.3"]
    first = ct(*submit, "--", "--ckpt_dir", ckpt, "--max_steps", "8", "--every", "4")
    newest = checkpoint_store.list_complete(store)[-1]
    names = sorted(f["path"] for f in newest.manifest["files"])
    shards = [n for n in names if n.endswith(".distcp") or n.endswith(".metadata")]
    prefix = "step-8/" if folder else ""
    assert shards == [f"{prefix}.metadata", f"{prefix}__0_0.distcp", f"{prefix}__1_0.distcp"], (
        names, first.stdout[-2000:] + first.stderr[-2000:])
    again = ct(*submit, "--", "--ckpt_dir", ckpt, "--max_steps", "12", "--every", "4")
    out = again.stdout + again.stderr
    resumed, done = RESUMED.search(out), DONE.search(out)
    assert resumed and int(resumed.group(1)) == 8 and done and int(done.group(1)) == 12, out[-4000:]
    left = storage.store_for(store).list(storage.join(store, PARTS))
    assert left == [], f"the parts leave the store at the job's end: {left}"


@pytest.mark.soak  # two HF runs on 2 nodes, one preempted: ~80 s, a long end-to-end run (nox -s soak)
def test_a_two_node_hf_trainer_preempted_resumes_to_the_uninterrupted_weights(
        tmp_path: Path, _no_stray_jobs: None) -> None:
    """37.6 end to end: the HF Trainer on 2 nodes x 1 process, a GPT-2 with dropout. Every rank saves its own
    rng_state_<rank>.pth; node 1's was never published, so the restarted node 1 drew other dropout masks and the
    run ended with other weights than the uninterrupted one. Now the checkpoint holds both, and the weights match."""
    ct = Cloudtrain(tmp_path / "home", tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hf_trainer.py").write_text((SCRIPTS / "byo" / "hf_trainer.py").read_text())
    args = ["--output_dir", "out", "--max_steps", "12", "--save_steps", "4"]

    def submit(store: str, *extra: str, slow: tuple[str, ...] = ()) -> str:
        return ct("submit", str(proj / "hf_trainer.py"), "--nodes", "2", "--procs-per-node", "1",
                  "--checkpoint-uri", store, "--checkpoint-dir", "out", "--env", "CLOUDTRAIN_CHECKPOINT_QUIET=0.5",
                  *extra, "--", *args, *slow).stdout

    whole = DONE.search(submit((tmp_path / "whole").as_uri()))
    assert whole, "the uninterrupted run printed no result"
    handle = submit((tmp_path / "store").as_uri(), "--max-restarts", "1", "--detach",
                    "--resume-arg=--resume_from_checkpoint", slow=("--step_sleep", "1")).strip()
    log = tmp_path / "home" / "jobs" / handle.split("://", 1)[1] / "node-0.log"
    wait_for(lambda: log.exists() and "[cloudtrain] published checkpoint-" in log.read_text(errors="replace"),
             timeout=240, interval=0.1)
    ct("preempt", handle)
    ct("wait", handle, "--timeout", "300")
    out = log.read_text(errors="replace")
    restarted = out.partition("restart 1 after preemption")[2]
    resumed, done = RESUMED.search(restarted), DONE.search(restarted)
    assert resumed and int(resumed.group(1)) >= 4 and done, out[-4000:]
    node1 = (log.parent / "node-1.log").read_text(errors="replace")
    assert "Didn't find an RNG file" not in node1, node1[-3000:]
    assert done.group(2) == whole.group(2), f"weights differ from the uninterrupted run's: {out[-3000:]}"
