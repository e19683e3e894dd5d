"""A plain script that keeps its own checkpoints in CLOUDTRAIN_CHECKPOINT_DIR (like /opt/ml/checkpoints)."""

import os
from pathlib import Path

import torch.distributed as dist

dist.init_process_group("gloo")
root = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
done = sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "state.txt").exists())
start = done[-1] if done else 0
if dist.get_rank() == 0:
    print(f"plain: resumed at {start}", flush=True)
    for step in range(start + 1, start + 4):
        folder = root / f"step-{step:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.txt").write_text(str(step))
dist.barrier()
