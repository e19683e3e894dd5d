"""Restore at scale: on several nodes a node's restore leaves a Checkpointer's DCP shards to the ranks whose load
reads them, and those ranks fetch them, verified, once per node (cloudtrain/checkpoint/on_demand.py)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import storage
from cloudtrain.checkpoint import download as checkpoint_download
from cloudtrain.checkpoint import on_demand
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import MANIFEST, CorruptCheckpoint, quarantine_name
from tests.conftest import REPO

STEP = 7
FILES = {".metadata": 3_000, "__0_0.distcp": 400_000, "__0_1.distcp": 300_000, "__1_0.distcp": 500_000,
         "__1_1.distcp": 200_000, "extra/rank-0.pt": 900, "extra/rank-1.pt": 900}


def _publish(tmp_path: Path, uri: str, kind: str = "full") -> dict[str, bytes]:
    """A checkpoint of two ranks in the store, as the Checkpointer publishes it (``kind``: whose layout)."""
    data = {name: os.urandom(size) for name, size in FILES.items()}
    folder = tmp_path / "written"
    for name, content in data.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    remote = storage.join(uri, checkpoint_store.step_dir(STEP))
    files = checkpoint_store.describe_and_upload(folder, sorted(data), remote)
    checkpoint_store.publish(remote, STEP, files, world_size=2, kind=kind)
    return data


def _held(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("store_root", ["file", "s3"], indirect=True)
def test_a_node_of_several_restores_the_small_files_and_leaves_the_shards(store_root: str, tmp_path: Path) -> None:
    uri = storage.join(store_root, "ckpt")
    data = _publish(tmp_path, uri)
    lines: list[str] = []
    found = checkpoint_restore.restore_latest(uri, tmp_path / "node", log=lines.append, nodes=2)
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    assert found is not None and found.step == STEP
    assert _held(folder) == {".metadata", "extra/rank-0.pt", "extra/rank-1.pt", MANIFEST}
    assert any("GB of shards left to the ranks that read them" in line for line in lines), lines
    for name in (".metadata", "extra/rank-1.pt"):
        assert (folder / name).read_bytes() == data[name]
    # one node: the whole checkpoint, as before
    whole = checkpoint_restore.restore_latest(uri, tmp_path / "alone", log=lines.append, nodes=1)
    assert whole is not None and _held(tmp_path / "alone" / checkpoint_store.step_dir(STEP)) == {*FILES, MANIFEST}


def test_only_the_checkpointers_own_checkpoints_leave_their_shards(tmp_path: Path) -> None:
    """A plain script's step folder ("files") is read by the script itself, not by a load plan: whole, always."""
    uri = (tmp_path / "store").as_uri()
    _publish(tmp_path, uri, kind="files")
    checkpoint_restore.restore_latest(uri, tmp_path / "node", nodes=4)
    assert _held(tmp_path / "node" / checkpoint_store.step_dir(STEP)) == {*FILES, MANIFEST}


def test_a_restart_in_place_keeps_the_shards_it_holds(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    data = _publish(tmp_path, uri)
    earlier = tmp_path / "previous-run" / checkpoint_store.step_dir(STEP)
    earlier.mkdir(parents=True)
    (earlier / "__1_0.distcp").write_bytes(data["__1_0.distcp"])
    (earlier / "__1_1.distcp").write_bytes(bytes(len(data["__1_1.distcp"])))  # same size, other bytes
    moved: list = []
    checkpoint_restore.restore_latest(uri, tmp_path / "node", earlier=[earlier.parent], moved=moved, nodes=2)
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    assert "__1_0.distcp" in _held(folder) and "__1_1.distcp" not in _held(folder)
    assert moved[0].local_bytes == FILES["__1_0.distcp"]
    assert moved[0].left_bytes == sum(size for name, size in FILES.items() if name.endswith(".distcp")) - \
        FILES["__1_0.distcp"]


@pytest.mark.parametrize("store_root", ["file", "gs"], indirect=True)
def test_a_rank_fetches_the_files_its_load_reads_verified(store_root: str, tmp_path: Path) -> None:
    uri = storage.join(store_root, "ckpt")
    data = _publish(tmp_path, uri)
    checkpoint_restore.restore_latest(uri, tmp_path / "node", nodes=2)
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    source = on_demand.OnDemand(uri, STEP, folder)
    source.fetch(["__1_0.distcp", "__1_1.distcp", ".metadata"])
    assert (folder / "__1_0.distcp").read_bytes() == data["__1_0.distcp"]
    assert (folder / "__1_1.distcp").read_bytes() == data["__1_1.distcp"]
    assert "__0_0.distcp" not in _held(folder)
    assert source.fetched.bytes == FILES["__1_0.distcp"] + FILES["__1_1.distcp"]  # .metadata was there
    assert not any(p.suffix == ".part" for p in folder.rglob("*"))
    with pytest.raises(CorruptCheckpoint, match="does not list"):
        source.fetch(["__9_0.distcp"])


def test_a_shard_that_does_not_match_is_never_placed(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    _publish(tmp_path, uri)
    checkpoint_restore.restore_latest(uri, tmp_path / "node", nodes=2)
    stored = tmp_path / "store" / checkpoint_store.step_dir(STEP) / "__0_1.distcp"
    stored.write_bytes(bytes(stored.stat().st_size))  # same size, other bytes
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    source = on_demand.OnDemand(uri, STEP, folder)
    with pytest.raises(CorruptCheckpoint, match=r"__0_1\.distcp does not match"):
        source.fetch(["__0_0.distcp", "__0_1.distcp"])
    assert "__0_1.distcp" not in _held(folder) and not any(p.suffix == ".part" for p in folder.rglob("*"))
    source.quarantine("test")
    listed = checkpoint_store.list_complete(uri)  # the marker hides it from every later listing
    assert listed == [] and any(p.name.startswith("quarantine-") for p in stored.parent.iterdir())


def test_a_node_that_restored_another_step_reads_the_stores_manifest(tmp_path: Path) -> None:
    """Node 0 chose step N; this node's own restore fell back (or found nothing): its ranks fetch from the store."""
    uri = (tmp_path / "store").as_uri()
    data = _publish(tmp_path, uri)
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    source = on_demand.OnDemand(uri, STEP, folder)
    source.fetch([".metadata", "extra/rank-1.pt"])
    assert (folder / "extra/rank-1.pt").read_bytes() == data["extra/rank-1.pt"]
    assert MANIFEST not in _held(folder)  # never taken for a restored folder of its own
    with pytest.raises(CorruptCheckpoint, match="manifest could not be read"):
        on_demand.OnDemand(uri, STEP + 1, tmp_path / "node" / "other").fetch([".metadata"])


def _fetch_in_process(uri: str, folder: str, names: list[str], log: str, start) -> None:
    fetch = checkpoint_download.fetch_objects

    def recorded(store, items, link, log_):
        with open(log, "a") as out:
            for remote, _local, _size in items:
                out.write(remote.rsplit("/", 1)[1] + "\n")
        return fetch(store, items, link, log_)

    checkpoint_download.fetch_objects = recorded
    start.wait()
    on_demand.OnDemand(uri, STEP, Path(folder)).fetch(names)


def test_the_ranks_of_a_node_fetch_each_file_once(tmp_path: Path) -> None:
    """Four ranks of one node whose loads read the same shards (replicated state, as DDP's): each shard crosses
    the network once, whoever fetches it, and every rank finds all of them in place, whole."""
    uri = (tmp_path / "store").as_uri()
    data = _publish(tmp_path, uri)
    checkpoint_restore.restore_latest(uri, tmp_path / "node", nodes=2)
    folder = tmp_path / "node" / checkpoint_store.step_dir(STEP)
    shards = sorted(name for name in FILES if name.endswith(".distcp"))
    context = multiprocessing.get_context("fork")
    start = context.Barrier(4)
    log = tmp_path / "fetched.txt"
    ranks = [context.Process(target=_fetch_in_process, args=(uri, str(folder), order, str(log), start))
             for order in (shards, shards[::-1], shards[1:] + shards[:1], shards)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(60)
    assert [rank.exitcode for rank in ranks] == [0, 0, 0, 0]
    assert sorted(log.read_text().split()) == shards  # each once
    for name in shards:
        assert (folder / name).read_bytes() == data[name]


LOADS = r'''
import json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
from cloudtrain.runtime import Checkpointer

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
ckpt = Checkpointer(model, opt, keep=3, local_dir=Path(os.environ["NODE_DIR"]) / "ckpt")
if sys.argv[1] == "seed":
    digests = {}
    for step in (1, 2):
        model(torch.randn(4, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.save(step, block=True)
        digests[step] = [float(p.double().sum()) for p in model.parameters()]
    print("DIGESTS " + json.dumps(digests), flush=True)
else:
    step = ckpt.restore()
    print("RESUMED %d %d %s" % (rank, step, json.dumps([float(p.double().sum()) for p in model.parameters()])),
          flush=True)
ckpt.close(save=False)
dist.destroy_process_group()
'''


def _two_nodes(tmp_path: Path, phase: str, store: str) -> str:
    """Two nodes of one process each (torchrun's static rendezvous), each with a checkpoint folder of its own."""
    from tests.emulators import free_port

    script = tmp_path / "loads.py"
    script.write_text(LOADS)
    port = str(free_port())
    nodes = []
    for node in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(REPO), "NODE_DIR": str(tmp_path / f"node-{node}"),
               "CLOUDTRAIN_CHECKPOINT_URI": store, "CLOUDTRAIN_JOB_ID": "two-nodes"}
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port, str(script), phase],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    out = [p.communicate(timeout=240)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in out)
    return "\n".join(out)


def test_a_shard_a_rank_reads_corrupt_makes_every_rank_fall_back(tmp_path: Path) -> None:
    """Two nodes: each node's restore takes the newest checkpoint's small files; a shard the ranks then read does
    not match the manifest, so that checkpoint is quarantined and both ranks load the previous one, the same one."""
    store = (tmp_path / "store").as_uri()
    seeded = _two_nodes(tmp_path, "seed", store)
    digests = json.loads(re.search(r"DIGESTS (.*)", seeded).group(1))  # type: ignore[union-attr]
    newest = tmp_path / "store" / checkpoint_store.step_dir(2)
    for shard in newest.glob("*.distcp"):
        shard.write_bytes(bytes(shard.stat().st_size))  # same size, other bytes
    for node in (0, 1):  # fresh nodes
        shutil.rmtree(tmp_path / f"node-{node}")
    resumed = _two_nodes(tmp_path, "resume", store)
    found = dict((int(r), (int(s), json.loads(d))) for r, s, d in re.findall(r"RESUMED (\d) (\d) (\[.*\])", resumed))
    assert found == {0: (1, digests["1"]), 1: (1, digests["1"])}, resumed[-4000:]
    assert "checkpoint step 2 is corrupt" in resumed and "falling back to the previous one" in resumed
    manifest = (newest / MANIFEST).read_bytes()
    assert (newest / quarantine_name(hashlib.sha256(manifest).hexdigest())).is_file()
    assert [c.step for c in checkpoint_store.list_complete(store)] == [1]


READS = r'''
import sys
from pathlib import Path
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict
from cloudtrain.runtime import dcp_files

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
model(torch.randn(4, 64)).sum().backward()
opt.step()
state = dict(zip(("model", "optim"), get_state_dict(model, opt)))
planner = dcp_files.SavePlanner() if sys.argv[2] == "cloudtrain" else None
dcp.save(state, storage_writer=dcp_files.writer(sys.argv[1], 2), planner=planner)
read = []
dcp.load(state, storage_reader=dcp_files.ParallelFileSystemReader(sys.argv[1], 2, before_read=read.extend))
Path(sys.argv[1] + ".reads-%d" % dist.get_rank()).write_text(" ".join(read))
dist.barrier()
# then meet once more outside gloo before any rank tears its group down: a rank that closed its gloo sockets while a
# peer was still finishing the barrier aborted that peer (SIGABRT after every rank had written its reads, twice in
# full-suite runs)
import os
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
store.set(f"reads-done-{dist.get_rank()}", "1")
store.wait([f"reads-done-{rank}" for rank in range(dist.get_world_size())])
dist.destroy_process_group()
'''


@pytest.mark.parametrize("planner", ["torch", "cloudtrain"])
def test_a_sharded_rank_reads_its_own_files_and_the_lowest_ranks(planner: str, tmp_path: Path) -> None:
    """FSDP's optimizer step counts are held by every rank. torch's planner spreads such items over the ranks'
    files, so each rank's load reads a little of every file; cloudtrain's has the lowest rank write them."""
    script = tmp_path / "reads.py"
    script.write_text(READS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                          str(script), str(tmp_path / "ckpt"), planner], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})
    ranks_said = "\n".join(line for line in run.stderr.splitlines() if line.startswith("[rank") or "terminate" in line
                           or "what():" in line)  # the workers' own lines, not torchrun's report of their end
    assert run.returncode == 0, run.stdout[-3000:] + ranks_said[-3000:] + run.stderr[-2000:]
    reads = {rank: set(Path(f"{tmp_path / 'ckpt'}.reads-{rank}").read_text().split()) for rank in range(4)}
    owners = {rank: {int(name[2]) for name in names} for rank, names in reads.items()}  # __<rank>_<i>.distcp
    if planner == "cloudtrain":
        assert owners == {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 3}}
    else:  # what cloudtrain's planner is for: the reads torch's choice makes
        assert any(len(ranks) > 2 for ranks in owners.values()), owners


@pytest.mark.slow
def test_each_node_of_an_fsdp_job_fetches_only_what_its_ranks_read(tmp_path: Path) -> None:
    """2 nodes x 2 processes, the reference FSDP trainer. A resubmission with nothing left to train restores and
    stops: each node's folder then holds the shards its ranks read (their own and rank 0's), never all four. Trained
    on from there, the run ends bitwise equal to an uninterrupted one."""
    from tests.support import Cloudtrain, assert_bitwise_equal, final_weights

    ct = Cloudtrain(tmp_path / "home", tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    script = proj / "train_fsdp.py"
    script.write_text((REPO / "entrypoints" / "train_fsdp.py").read_text())

    def submit(run: str, epochs: str) -> str:
        done = ct("submit", str(script), "--nodes", "2", "--procs-per-node", "2", "--checkpoint-uri",
                  (tmp_path / f"ckpt-{run}").as_uri(), "--output-uri", (tmp_path / f"out-{run}").as_uri(), "--",
                  "--epochs", epochs, "--samples", "512")  # 4 steps per epoch (4 ranks x 32)
        return done.stdout + done.stderr

    submit("straight", "2")
    submit("resumed", "1")
    before = set((tmp_path / "home" / "jobs").iterdir())
    restored = submit("resumed", "1")  # restores step 4, trains nothing, saves nothing
    assert "INFO resumed from step 4" in restored and "shards left to the ranks that read them" in restored, \
        restored[-3000:]
    (job,) = set((tmp_path / "home" / "jobs").iterdir()) - before
    held = {}
    for node in (0, 1):
        folder = job / f"node-{node}" / "checkpoints" / "step-000000004"
        held[node] = {int(p.name[2:].split("_")[0]) for p in folder.glob("__*.distcp")}  # __<rank>_<i>.distcp
    # the ranks on a node are the rendezvous' choice: two consecutive ones, whichever node
    assert sorted(len(ranks) for ranks in held.values()) == [2, 3] and all(0 in ranks for ranks in held.values()), held
    assert held[0] | held[1] == {0, 1, 2, 3}
    again = submit("resumed", "2")
    assert "INFO resumed from step 4" in again, again[-3000:]
    assert_bitwise_equal(final_weights((tmp_path / "out-resumed").as_uri()),
                         final_weights((tmp_path / "out-straight").as_uri()))
