"""A node restores a checkpoint once, before its workers start; the Checkpointer on every rank then loads what the
node restored, without listing the store or downloading anything again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cloudtrain.checkpoint import store as checkpoint_store
from tests.node_support import REPO, make_bundle, node_env

TRAIN = '''
import os, sys
import torch
import torch.distributed as dist
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.runtime import Checkpointer

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if sys.argv[1] == "resume":
    def listed_again(*args, **kwargs):
        raise AssertionError("the Checkpointer listed the store although its node had restored it")
    checkpoint_restore.restore_latest = listed_again
ckpt = Checkpointer(model, opt)
step = ckpt.restore()
print("rank %d resumed at %d" % (dist.get_rank(), step), flush=True)
if sys.argv[1] == "seed":
    for step in range(1, 4):
        opt.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
    ckpt.save(step, block=True)
ckpt.close(save=False)
dist.destroy_process_group()
'''


def _node(tmp_path: Path, bundle: Path, name: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = node_env(tmp_path, CLOUDTRAIN_CHECKPOINT_URI=store.as_uri(), CLOUDTRAIN_LINEAGE="lineage-1",
                   PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "entrypoints" / "bootstrap.py"), "--bundle", str(bundle),
                           "--workdir", str(tmp_path / f"work-{name}"), "--script", "train.py", "--nproc-per-node",
                           "2", "--", name], env=env, capture_output=True, text=True, timeout=300)


def test_the_checkpointer_loads_what_its_node_restored(tmp_path: Path) -> None:
    store = tmp_path / "store"
    bundle = make_bundle(tmp_path, TRAIN)
    seeded = _node(tmp_path, bundle, "seed", store)
    assert seeded.returncode == 0, seeded.stdout[-3000:] + seeded.stderr[-3000:]
    assert [c.step for c in checkpoint_store.list_complete(store.as_uri())] == [3]
    resumed = _node(tmp_path, bundle, "resume", store)  # a new node (its own folder): restores, then trains
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "checkpoint: resuming from step 3" in resumed.stdout
    # one line per restore, with what it moved (issue 37.10: each restore was logged twice)
    said = resumed.stdout + resumed.stderr
    assert re.search(r"checkpoint: resuming from step 3 \([\d.]+s; [\d.]+ GB in [\d.]+s", said), said[-3000:]
    assert "restored file://" not in said, said[-3000:]
    assert "rank 0 resumed at 3" in resumed.stdout and "rank 1 resumed at 3" in resumed.stdout, resumed.stdout

