"""Plain torch.distributed.checkpoint (DCP), the way torchtitan lays checkpoints out; nothing cloudtrain-specific.

A DDP model (gloo on CPU) and Adam; every ``--every`` steps ``dcp.save({"model", "optim", "step"})`` into
``CKPT_DIR/step-<N>/``, with the model and optimizer state dicts from ``get_state_dict``. Every rank writes its own
``__<rank>_0.distcp`` shard (DCP spreads the replicated tensors over the ranks) and rank 0 writes ``.metadata`` last,
after all ranks finished. ``--resume`` loads the newest ``step-<N>`` that has a ``.metadata`` (none: it starts from
scratch) with ``dcp.load`` + ``set_state_dict``.

    torchrun --nproc-per-node 2 dcp_plain.py --ckpt_dir CK --max_steps 12 --every 4
    torchrun --nproc-per-node 2 dcp_plain.py --ckpt_dir CK --max_steps 12 --every 4 --resume
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def newest_complete(ckpt_dir: str) -> tuple[int, str] | None:
    """The highest step-<N> folder that has DCP's .metadata (written last, once every rank's shard is written)."""
    if not os.path.isdir(ckpt_dir):
        return None
    found = []
    for name in os.listdir(ckpt_dir):
        m = re.fullmatch(r"step-(\d+)", name)
        if m and os.path.isfile(os.path.join(ckpt_dir, name, ".metadata")):
            found.append((int(m.group(1)), os.path.join(ckpt_dir, name)))
    return max(found) if found else None


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one rank at one step: the same whether or not the run was resumed."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) + 0.05 * torch.randn(8, 1, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt_dir", required=True)
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="load the newest complete step-<N> (if any)")
    p.add_argument("--step_sleep", type=float, default=0.0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    step = 0
    if args.resume:
        # every rank must pick the same folder: rank 0 looks, and tells the others
        choice = [newest_complete(args.ckpt_dir) if rank == 0 else None]
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is not None:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
            dcp.load(state, checkpoint_id=choice[0][1])
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            step = int(state["step"])
            if rank == 0:
                print(f"[byo] resumed from step {step}", flush=True)

    while step < args.max_steps:
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.every == 0:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)},
                     checkpoint_id=os.path.join(args.ckpt_dir, f"step-{step}"))
        if rank == 0:
            print(f"[byo] step {step}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    # Wait here for the others before tearing down. Without it torch 2.13 deadlocks about every other run at exit:
    # the gloo worker thread is still dropping DCP's last broadcast (tensors made in Python: it needs the GIL) while
    # the main thread, holding the GIL, joins that thread in ~ProcessGroupGloo (run by the DDP Reducer's destructor).
    dist.barrier()
    if rank == 0:
        print(f"[byo] done step {step} params {params_digest(model.module)}", flush=True)
    # The barrier narrows that window but does not close it: with two processes under load the teardown still hung
    # (2 nodes x 1 process, tests/test_checkpoint_parts.py, about one run in five). Everything is saved and said:
    # leave without running torch's destructors (torchrun sees exit 0, as after a clean teardown).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
