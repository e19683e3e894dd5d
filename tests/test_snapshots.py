"""Snapshots of the checkpoint layouts real stacks write (cloudtrain/checkpoint/snapshots.py): what is
complete, what is published, what a restore puts back. Real files (torch.save's zip format, safetensors), a real
file:// store."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
import torch

from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint import sync as checkpoint_sync
from cloudtrain.checkpoint.manifest import MANIFEST


def save(path: Path, value: float, mb: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.full((4,), value), "pad": torch.zeros(mb * 262144)}, path)


def safetensors_bytes(n: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * n)


def store(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


def published(uri: str) -> list[tuple[int, list[str]]]:
    return [(c.step, sorted(f["path"] for f in c.manifest["files"])) for c in checkpoint_store.list_complete(uri)]


def test_file_complete_reads_the_format(tmp_path: Path) -> None:
    whole = tmp_path / "ckpt.pt"
    save(whole, 1.0, mb=1)
    data = whole.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    tensors = tmp_path / "model.safetensors"
    tensors.write_bytes(safetensors_bytes(1000))
    short = tmp_path / "short.safetensors"
    short.write_bytes(safetensors_bytes(1000)[:-10])
    other = tmp_path / "notes.json"
    other.write_text("{}")
    assert checkpoint_snapshots.file_complete(whole) is True
    assert checkpoint_snapshots.file_complete(cut) is False  # torch's zip: the central directory comes last
    assert checkpoint_snapshots.file_complete(tensors) is True
    assert checkpoint_snapshots.file_complete(short) is False
    assert checkpoint_snapshots.file_complete(other) is None  # no format to ask: the quiet period decides


def test_overwritten_file_gets_a_generation_each_version_and_a_torn_one_never(tmp_path: Path) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "ckpt.pt", 1.0)
    assert snap.poll() is None  # the first save: what a save writes is known once the next one begins (issue 50.2)
    assert snap.poll() is None and published(uri) == []
    save(root / "ckpt.pt", 2.0)
    good = (root / "ckpt.pt").read_bytes()
    (root / "ckpt.pt").write_bytes(good[: len(good) // 3])  # a save cut short (a kill while torch.save wrote it)
    assert snap.poll() is None  # written again: a save is ckpt.pt, and this one is torn
    assert snap.set.together == {"ckpt.pt"}
    assert snap.poll(final=True) is None
    assert "ckpt.pt is incomplete" in snap.unpublished[0]
    (root / "ckpt.pt").write_bytes(good)
    assert snap.poll(final=True) == 1
    save(root / "ckpt.pt", 3.0)
    assert snap.poll() == 2  # the set is known: each version is published the moment it is whole
    assert published(uri) == [(1, ["ckpt.pt"]), (2, ["ckpt.pt"])]


def test_restore_puts_the_files_back_under_their_names_and_nothing_beside(tmp_path: Path) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "checkpoint-10" / "optimizer.pt", 1.0)
    (root / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    save(root / "checkpoint-20" / "optimizer.pt", 2.0)
    (root / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 20}')
    (root / "config.json").write_text("{}")
    assert snap.poll() == 10  # checkpoint-20 was begun: checkpoint-10 is a whole save
    assert snap.poll() == 20  # the script's own step, now that the set of a save is known
    fresh = tmp_path / "node2" / "out"
    report = checkpoint_restore.restore_report(uri, fresh)
    assert report["step"] == 20 and report["entries"] == ["checkpoint-20", "config.json"]
    assert sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("*")) == [
        "checkpoint-20", "checkpoint-20/optimizer.pt", "checkpoint-20/trainer_state.json", "config.json"]
    assert not (fresh / MANIFEST).exists()
    assert not list(fresh.parent.glob(".*incoming*"))  # the staging folder is gone


def test_folder_without_the_file_its_stack_writes_last_is_never_taken(tmp_path: Path) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "checkpoint-5" / "optimizer.pt", 1.0)
    (root / "checkpoint-5" / "trainer_state.json").write_text("{}")
    assert snap.poll() is None  # the first save of the run: uploaded ...
    save(root / "checkpoint-10" / "optimizer.pt", 2.0)  # killed before trainer_state.json
    (root / "checkpoint-10" / "training_args.bin").write_bytes(b"x")
    assert snap.poll() == 5  # ... and published once the next save has begun
    assert snap.poll(final=True) is None  # checkpoint-5 stands in for it, and is in the store already
    assert snap.unpublished and "trainer_state.json" in snap.unpublished[0]
    dcp = root / "ckpt" / "run-3"  # a DCP folder inside a layout of the script's own
    late = checkpoint_snapshots.Snapshotter(root / "ckpt", uri, keep=2, quiet=0.0)
    dcp.mkdir(parents=True)
    (dcp / "__0_0.distcp").write_bytes(b"shard")
    assert late.poll(final=True) is None and ".metadata" in late.unpublished[0]
    (dcp / ".metadata").write_bytes(b"meta")  # complete on one node of two: rank 1's shard is on the other
    two = checkpoint_snapshots.Snapshotter(root / "two", uri, keep=2, quiet=0.0, world_size=2)
    (root / "two").mkdir()
    os.replace(dcp, root / "two" / "run-3")
    assert two.poll(final=True) is None and "rank 1" in two.unpublished[0]
    assert published(uri) == [(5, ["checkpoint-5/optimizer.pt", "checkpoint-5/trainer_state.json"])]


def test_a_snapshot_waits_for_the_quiet_period_and_takes_families_newest(tmp_path: Path) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=3600.0)
    save(root / "epoch=0-step=4.ckpt", 1.0)
    save(root / "epoch=0-step=8.ckpt", 2.0)
    save(root / "last.ckpt", 2.0)
    assert snap.poll() is None  # changed just now: the save may not be over
    assert snap.poll(final=True) == 8
    assert published(uri) == [(8, ["epoch=0-step=8.ckpt", "last.ckpt"])]
    one = checkpoint_snapshots.Snapshotter(tmp_path / "one", store(tmp_path / "other"), keep=2, quiet=3600.0)
    save(tmp_path / "one" / "ckpt.pt", 1.0)
    # one file that says itself it is whole may still be the first of several a save writes (issue 50.2): the
    # first save waits for the next one, or the end
    assert one.poll() is None and one.poll(final=True) == 1


def test_a_file_rewritten_during_its_upload_voids_that_snapshot(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    save(root / "ckpt.pt", 1.0)
    snap = checkpoint_snapshots.Snapshotter(tmp_path / "empty", uri, keep=2, quiet=0.0, files=["ckpt.pt"])
    snap.root = root
    real = checkpoint_store.describe_and_upload

    def upload_then_rewrite(*args: object, **kwargs: object) -> object:
        entries = real(*args, **kwargs)  # type: ignore[arg-type]
        save(root / "ckpt.pt", 2.0)  # the script saved again while the bytes were on their way
        return entries

    monkeypatch.setattr(checkpoint_store, "describe_and_upload", upload_then_rewrite)
    assert snap.poll() is None
    assert published(uri) == []
    monkeypatch.setattr(checkpoint_store, "describe_and_upload", real)
    assert snap.poll() == 2  # taken again, under a new number: the void attempt's objects never mix with it
    assert published(uri) == [(2, ["ckpt.pt"])]
    checkpoint_restore.restore_latest(uri, tmp_path / "restored")
    assert torch.load(tmp_path / "restored" / "ckpt.pt")["w"][0].item() == 2.0


def test_special_files_and_links_out_of_the_folder_are_never_opened(tmp_path: Path) -> None:
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    root.mkdir()
    os.mkfifo(root / "data.pt")
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("not a checkpoint")
    (root / "link.txt").symlink_to(secret)
    save(root / "model.pt", 1.0)
    (root / "last.pt").symlink_to("model.pt")  # Lightning's save_last="link"
    (root / "hf").mkdir()
    (root / "hf" / ".tmpk3j2x9").write_bytes(b"safetensors being written, renamed when done")
    (root / "hf" / ".metadata.tmp").write_bytes(b"DCP's metadata being written")
    assert sorted(checkpoint_snapshots.scan(root)) == ["last.pt", "model.pt"]
    assert snap.poll(final=True) == 1
    assert published(uri) == [(1, ["last.pt", "model.pt"])]
    # what was there when the node started counts as in the store
    assert snap.published == {**checkpoint_snapshots.scan(root)}
    assert checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0).poll(final=True) is None


def test_a_folder_of_one_family_takes_its_newest_member(tmp_path: Path) -> None:
    """Accelerate's project_dir/checkpoints/checkpoint_<i>/: the newest checkpoint_<i> only, under its own path;
    a step-<N> folder is an entry like any other when the folder is the script's own."""
    root, uri = tmp_path / "proj", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    for i in range(3):
        save(root / "checkpoints" / f"checkpoint_{i}" / "model.pt", float(i))
    save(root / "ckpt" / "step-7" / "x.pt", 7.0)
    assert snap.poll(final=True) == 7
    assert published(uri) == [(7, ["checkpoints/checkpoint_2/model.pt", "ckpt/step-7/x.pt"])]
    fresh = tmp_path / "fresh"
    checkpoint_restore.restore_report(uri, fresh)
    assert sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("*.pt")) == [
        "checkpoints/checkpoint_2/model.pt", "ckpt/step-7/x.pt"]


def test_a_member_cut_short_without_a_kind_of_file_its_predecessor_has_is_not_final(tmp_path: Path) -> None:
    """Seen in the suite (test_byo_checkpoints[accelerate], a preemption that landed inside `save_state`): Accelerate
    writes the model, the optimizer, the RNG states and then each registered object, every file whole on its own.
    Stopped between two of them, checkpoint_2 held complete files only, so the final poll published it and the
    restart's `load_state` failed ("Found checkpoints: 0, Registered objects: 1"). After the workers exit, a family
    member missing a kind of file (numbers aside: random_states_<rank>) that its previous member holds was cut short:
    the previous member stands in. While they run, the quiet period decides (a script may change what it saves)."""
    root, uri = tmp_path / "proj", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    members = root / "checkpoints"
    for i in (0, 1):
        (members / f"checkpoint_{i}").mkdir(parents=True)
        (members / f"checkpoint_{i}" / "model.safetensors").write_bytes(safetensors_bytes(4))
        save(members / f"checkpoint_{i}" / "optimizer.bin", float(i))
        for rank in (0, 1):
            save(members / f"checkpoint_{i}" / f"random_states_{rank}.pkl", float(rank))
        save(members / f"checkpoint_{i}" / "custom_checkpoint_0.pkl", float(i))
    (members / "checkpoint_2").mkdir()
    (members / "checkpoint_2" / "model.safetensors").write_bytes(safetensors_bytes(4))
    save(members / "checkpoint_2" / "optimizer.bin", 2.0)  # stopped here: no RNG states, no custom object
    assert snap.poll(final=True) == 1  # checkpoint_1, whole, as step 1 (its name's number)
    assert published(uri) == [(1, [f"checkpoints/checkpoint_1/{name}" for name in (
        "custom_checkpoint_0.pkl", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
        "random_states_1.pkl")])]
    assert snap.unpublished and "checkpoint_2" in snap.unpublished[0] and "custom_checkpoint_" in snap.unpublished[0]
    # one rank fewer after a restart at another world size is the same kinds of file: final as it is
    resized = checkpoint_snapshots.Snapshotter(root, store(tmp_path / "resized"), keep=2, quiet=0.0)
    save(members / "checkpoint_2" / "random_states_0.pkl", 0.0)
    save(members / "checkpoint_2" / "custom_checkpoint_0.pkl", 2.0)
    assert resized.poll(final=True) == 2 and "checkpoint_2" in str(published(store(tmp_path / "resized")))


def test_a_torn_member_never_leaves_a_subset_as_the_newest_checkpoint(tmp_path: Path) -> None:
    """Issue 37.1: a loop saves model.pt then optim.pt, overwriting both; the preemption lands while optim.pt is
    written. Published before: model.pt alone as the newest checkpoint (the restart then failed on the missing
    optim.pt, every time). The previous complete pair stands; nothing new is published, and the node says why."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "model.pt", 1.0)
    save(root / "optim.pt", 1.0)
    assert snap.poll(final=True) == 1
    save(root / "model.pt", 2.0)
    save(root / "optim.pt", 2.0)
    whole = (root / "optim.pt").read_bytes()
    (root / "optim.pt").write_bytes(whole[: len(whole) // 2])
    assert snap.poll() is None and snap.poll(final=True) is None
    assert published(uri) == [(1, ["model.pt", "optim.pt"])]
    assert "optim.pt is incomplete" in snap.unpublished[0]


def test_a_checkpoint_cut_short_beside_a_grown_log_publishes_nothing(tmp_path: Path) -> None:
    """Issue 37.2 (nanoGPT-style): ckpt.pt torn while metrics.jsonl gained a line. Published before: metrics.jsonl
    alone, and with keep 2 the next publish deleted the last good checkpoint."""
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "ckpt.pt", 1.0)
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    assert snap.poll(final=True) == 1
    whole = (root / "ckpt.pt").read_bytes()
    (root / "ckpt.pt").write_bytes(whole[:100])
    with open(root / "metrics.jsonl", "a") as f:
        f.write('{"step": 2}\n')
    assert snap.poll(final=True) is None
    assert snap.poll(final=True) is None  # and again: retention never gets a newer "checkpoint" to keep instead
    assert published(uri) == [(1, ["ckpt.pt", "metrics.jsonl"])]
    (root / "ckpt.pt").unlink()  # gone (a script that removes, then writes): the same
    assert snap.poll(final=True) is None and published(uri) == [(1, ["ckpt.pt", "metrics.jsonl"])]
    assert any("ckpt.pt" in line for line in snap.unpublished)


def test_a_save_that_never_wrote_a_byte_is_not_published(tmp_path: Path) -> None:
    """Issue 37.3: a 0-byte ckpt.pt was published over the good one; the restart failed with BadZipFile."""
    root, uri = tmp_path / "out", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    save(root / "ckpt.pt", 1.0)
    assert snap.poll(final=True) == 1
    (root / "ckpt.pt").write_bytes(b"")
    assert snap.poll() is None and snap.poll(final=True) is None
    assert published(uri) == [(1, ["ckpt.pt"])]
    assert "ckpt.pt is empty" in snap.unpublished[0]
    fresh = checkpoint_snapshots.Snapshotter(tmp_path / "new", store(tmp_path / "other"), keep=2, quiet=0.0)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "model.pth").write_bytes(b"")  # no earlier version: the name says what it should hold
    assert fresh.poll(final=True) is None


def test_a_file_beside_the_step_folders_is_no_checkpoint_of_its_own(tmp_path: Path) -> None:
    """Issue 37.4: a plain script writes step-<N>/state.pt (published one by one) and, at its end, final.pt at the
    top of its checkpoint folder. Published before: final.pt alone as checkpoint N+1, which the next submission
    restored (training from step 0) and retention then deleted the real step folders for."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0, step_folders=False)
    for step in (5, 10):
        save(root / f"step-{step}" / "state.pt", float(step))
    assert checkpoint_sync.sync_dir(root, uri, final=True) == [5, 10]
    save(root / "final.pt", 9.0)
    assert snap.poll() is None and snap.poll(final=True) is None
    assert [step for step, _ in published(uri)] == [5, 10]
    assert "final.pt" in snap.unpublished[0] and "CLOUDTRAIN_OUTPUT_DIR" in snap.unpublished[0]


def test_a_checkpoint_rewritten_faster_than_it_uploads_is_still_published(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37.9: a 540 MB ckpt.pt rewritten every ~5 s, each upload longer than that: every snapshot was voided
    ("changed while it was uploaded") and nothing reached the store until the job ended. After one voided
    snapshot, the next is copied beside the folder first (in a moment) and uploaded from the copy, which no rewrite
    reaches; the node says so, with the upload's time."""
    root, uri = tmp_path / "out", store(tmp_path)
    save(root / "ckpt.pt", 1.0)
    snap = checkpoint_snapshots.Snapshotter(tmp_path / "empty", uri, keep=2, quiet=0.0, files=["ckpt.pt"])
    snap.root = root
    lines: list[str] = []
    snap.log = lines.append
    real = checkpoint_store.describe_and_upload
    version = [1.0]

    def upload_while_the_script_saves_again(*args: object, **kwargs: object) -> object:
        entries = real(*args, **kwargs)  # type: ignore[arg-type]
        version[0] += 1
        save(root / "ckpt.pt", version[0])  # rewritten in place (torch.save truncates the same file) meanwhile
        return entries

    monkeypatch.setattr(checkpoint_store, "describe_and_upload", upload_while_the_script_saves_again)
    assert snap.poll() is None  # voided: the upload read a file being rewritten
    assert any("changed while it was uploaded" in line and "copied on this node first" in line for line in lines)
    assert snap.poll() is not None  # from a copy: a rewrite during the upload no longer voids it
    newest = checkpoint_store.list_complete(uri)[-1]
    fresh = tmp_path / "restored"
    checkpoint_restore.restore_latest(uri, fresh)
    assert torch.load(fresh / "ckpt.pt")["w"][0].item() == 2.0  # the version that was copied, whole
    assert newest.manifest["entries"] == ["ckpt.pt"]
    assert not list(tmp_path.glob(".out.snapshot*"))  # the copy is gone


def test_retention_leaves_no_empty_folder_of_a_deep_layout_in_a_file_store(tmp_path: Path) -> None:
    """Issue 37.10: Accelerate's checkpoints/checkpoint_<i>/ nest three folders deep in a step folder; retention
    deleted the files and left step-<N>/checkpoints/ behind, empty, in a file:// store."""
    root, uri = tmp_path / "proj", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=2, quiet=0.0)
    for i in range(3):
        save(root / "checkpoints" / f"checkpoint_{i}" / "model.pt", float(i))
        assert snap.poll(final=True) is not None
    steps = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert steps == [checkpoint_store.step_dir(1), checkpoint_store.step_dir(2)], steps  # step 0: gone whole


def test_a_torn_step_folder_of_the_default_layout_is_never_published(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Sibling of 37.1-37.3 in cloudtrain's own layout (step-<N>/ folders in CLOUDTRAIN_CHECKPOINT_DIR): the last
    folder is published when the workers end. Before: a step-10/state.pt cut short by the preemption (or one that
    wrote nothing) was published as the newest checkpoint, and every restart failed loading it. Now it stays
    unpublished, said at the end; step 5 stands."""
    from cloudtrain import contract

    for var in (contract.CHECKPOINT_URI, contract.CHECKPOINT_DIR, contract.CHECKPOINT_LAYOUT, contract.NNODES):
        # the node adopts its environment into its process: set, then unset, so that monkeypatch puts each back as
        # it was (absent) at the end, and no later test of this worker runs with this test's store
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    uri = store(tmp_path)
    save(tmp_path / "ckpt" / "step-5" / "state.pt", 5.0)
    save(tmp_path / "ckpt" / "step-10" / "state.pt", 10.0)
    whole = (tmp_path / "ckpt" / "step-10" / "state.pt").read_bytes()
    (tmp_path / "ckpt" / "step-10" / "state.pt").write_bytes(whole[: len(whole) // 3])
    save(tmp_path / "ckpt" / "step-10" / "empty.pt", 0.0)
    sync = checkpoint_sync.PlainSync({contract.CHECKPOINT_URI: uri, contract.CHECKPOINT_DIR: "ckpt"}, tmp_path)
    assert sync.finish() is None
    assert [step for step, _ in published(uri)] == [5]
    assert any("step-10" in line and "state.pt is incomplete" in line for line in sync.unpublished())


def test_accelerates_checkpoint_i_is_published_as_checkpoint_i(tmp_path: Path) -> None:
    """Issue 37.10: Accelerate's automatic naming starts at checkpoint_0; in an empty store it was published as
    step 1, so checkpoint_1 became step 2, against docs/checkpoints.md (N is the script's own step)."""
    root, uri = tmp_path / "proj", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=3, quiet=0.0)
    for i in (0, 1):
        save(root / "checkpoints" / f"checkpoint_{i}" / "model.pt", float(i))
        assert snap.poll(final=True) == i
    assert [step for step, _ in published(uri)] == [0, 1]
    plain = checkpoint_snapshots.Snapshotter(tmp_path / "plain", store(tmp_path / "s2"), keep=2, quiet=0.0)
    save(tmp_path / "plain" / "ckpt.pt", 1.0)
    assert plain.poll(final=True) == 1  # a name with no step of its own: the next number, from 1 as before


def test_every_ranks_file_of_a_save_is_taken_never_the_highest_ranks_alone(tmp_path: Path) -> None:
    """Sibling of 37.1 (never a subset): a per-rank save at the top of the folder (FSDP's sharded torch.save per
    rank as model_rank_<r>.pt) read as a numbered family, so only
    the highest rank's file was published and a restart's rank 0 found nothing to load. Every rank's file is taken;
    a generation number beside the rank's (step100_rank0.pt) still picks the newest save of each rank."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=3, quiet=0.0, world_size=2)
    for rank in (0, 1):
        save(root / f"model_rank_{rank}.pt", float(rank))
    assert snap.poll(final=True) == 1
    assert published(uri)[-1][1] == ["model_rank_0.pt", "model_rank_1.pt"]
    steps = tmp_path / "steps"
    by_step = checkpoint_snapshots.Snapshotter(steps, store(tmp_path / "s1"), keep=3, quiet=0.0, world_size=2)
    for rank in (0, 1):
        save(steps / f"step100_rank{rank}.pt", 1.0)
        save(steps / f"step200_rank{rank}.pt", 2.0)
    assert by_step.poll(final=True) == 200
    assert published(store(tmp_path / "s1"))[-1][1] == ["step200_rank0.pt", "step200_rank1.pt"]


def test_a_family_saved_more_often_than_the_quiet_period_is_still_published(tmp_path: Path) -> None:
    """Found with plain DCP on 2 nodes saving every 1.6 s: the newest step-<N> folder was never quiet for the 2 s
    quiet period, so nothing was published while the job ran (40 steps, then step-40 at the end). The member before
    the one being written, once settled, is published meanwhile."""
    import time

    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=3, quiet=0.5)
    for step in (4, 8):  # a folder of two files: only the quiet period says a save of it is over
        save(root / f"step-{step}" / "model.pt", float(step))
        (root / f"step-{step}" / "meta.json").write_text("{}")
        if step == 4:
            assert snap.poll() is None  # just written
            time.sleep(0.6)
    assert snap.poll() == 4  # step-8 is being written: step-4 has settled
    time.sleep(0.6)
    assert snap.poll() == 8


def _saves(root: Path, *steps: tuple[str, int]) -> None:
    """Files saved one after another, each carrying its step (mtimes in the order written)."""
    for name, step in steps:
        save(root / name, float(step))
        time.sleep(0.02)


def test_a_look_between_two_saves_files_never_publishes_a_mix(tmp_path: Path) -> None:
    """Issue 50.3: model.pt and optim.pt overwritten in place. A look that lands after model.pt of the next save
    but before its optim.pt sees two new files, both changed since the last checkpoint: a mix (step 12's model with
    step 9's optim). The files of one save are written after its first file, as the saves before showed."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=20, quiet=0.0)
    _saves(root, ("model.pt", 3), ("optim.pt", 3))
    assert snap.poll() is None  # the first save: its set is not known yet
    _saves(root, ("model.pt", 6))
    assert snap.poll() is None  # written again: a save is model.pt then optim.pt; optim.pt is still step 3's
    assert snap.set.together == {"model.pt", "optim.pt"} and snap.set.first == "model.pt"
    _saves(root, ("optim.pt", 6))
    assert snap.poll() == 1
    _saves(root, ("model.pt", 9), ("optim.pt", 9), ("model.pt", 12))  # faster than the looks
    assert snap.poll() is None and len(published(uri)) == 1  # optim.pt (step 9) was written before model.pt
    _saves(root, ("optim.pt", 12))
    assert snap.poll() == 2
    for found in checkpoint_store.list_complete(uri):
        folder = Path(found.uri.removeprefix("file://"))
        assert torch.load(folder / "model.pt")["w"][0] == torch.load(folder / "optim.pt")["w"][0]


def test_a_file_a_save_leaves_out_is_no_longer_required_once_the_next_save_begins(tmp_path: Path) -> None:
    """pytorch/examples imagenet: checkpoint.pth.tar every epoch, model_best.pth.tar only when the model improved.
    Learned from a first save that wrote both, every later save would wait for a new best. Once the next save's
    first file is written while model_best.pth.tar was not, it is not part of every save: the save before is
    whole, and from then on a checkpoint needs checkpoint.pth.tar only."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=20, quiet=0.0)
    _saves(root, ("checkpoint.pth.tar", 1), ("model_best.pth.tar", 1))
    assert snap.poll() is None
    _saves(root, ("checkpoint.pth.tar", 2))
    assert snap.poll() is None and snap.set.together == {"checkpoint.pth.tar", "model_best.pth.tar"}
    _saves(root, ("checkpoint.pth.tar", 3))  # epoch 3 began; epoch 2 wrote no best
    assert snap.poll() == 1 and snap.set.together == {"checkpoint.pth.tar"}
    _saves(root, ("checkpoint.pth.tar", 4))
    assert snap.poll() == 2
    assert published(uri)[-1] == (2, ["checkpoint.pth.tar", "model_best.pth.tar"])


def test_declared_files_publish_each_save_the_moment_it_is_whole(tmp_path: Path) -> None:
    """checkpoint.files: no wait for the next save, not even for the first; a declared file that is the last
    checkpoint's copy (optim.pt not written again yet) holds the snapshot back."""
    root, uri = tmp_path / "ckpt", store(tmp_path)
    snap = checkpoint_snapshots.Snapshotter(root, uri, keep=20, quiet=0.0, files=["model.pt", "optim.pt"])
    _saves(root, ("model.pt", 1))
    assert snap.poll() is None  # optim.pt: no file matches yet
    _saves(root, ("optim.pt", 1))
    assert snap.poll() == 1
    _saves(root, ("model.pt", 2))
    assert snap.poll() is None  # optim.pt is the last checkpoint's copy
    _saves(root, ("optim.pt", 2))
    assert snap.poll() == 2


def test_a_first_save_is_published_when_the_workers_succeed_and_not_when_they_are_stopped(tmp_path: Path) -> None:
    """Issue 50.2: after the workers exit, a first save whose set is not known is whole only if they ended on
    their own (exit 0): stopped in the pause between model.pt and optim.pt, model.pt alone is not a checkpoint."""
    root = tmp_path / "ckpt"
    _saves(root, ("model.pt", 1))
    stopped = checkpoint_snapshots.Snapshotter(tmp_path / "none", store(tmp_path / "a"), keep=2, quiet=0.0)
    stopped.root, stopped.published = root, {}
    assert stopped.poll(final=True, succeeded=False) is None
    assert "the workers were stopped (or failed) before a next save showed it whole" in stopped.unpublished[0]
    ended = checkpoint_snapshots.Snapshotter(tmp_path / "none", store(tmp_path / "b"), keep=2, quiet=0.0)
    ended.root, ended.published = root, {}
    assert ended.poll(final=True, succeeded=True) == 1
