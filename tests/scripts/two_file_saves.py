"""A plain DDP loop whose save writes two files, ``model.pt`` and then, after other work, ``optim.pt``, overwritten in
place (issue 50.2, 50.3, 50.6): what a save that gathers optimizer state before writing it does. Each file carries
the step it was saved at; ``--resume`` loads both and says which steps it found. Nothing cloudtrain-specific.

    torchrun --nproc-per-node 1 two_file_saves.py --ckpt_dir D --steps 12 --every 3 --pause 2.5 [--resume]

Lines (rank 0): ``[two] wrote model.pt of step N`` (the moment model.pt is whole), ``[two] saved step N`` (both
written), ``[two] resumed model.pt of step A with optim.pt of step B``, ``[two] done step N``. A resume that finds
a file missing fails as a real script would (FileNotFoundError).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt_dir", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.0, help="seconds between writing model.pt and optim.pt")
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    model_path, optim_path = os.path.join(args.ckpt_dir, "model.pt"), os.path.join(args.ckpt_dir, "optim.pt")
    step = 0
    if args.resume:
        saved_model = torch.load(model_path)
        saved_optim = torch.load(optim_path)
        model.module.load_state_dict(saved_model["model"])
        optim.load_state_dict(saved_optim["optim"])
        step = saved_optim["step"]
        if rank == 0:
            print(f"[two] resumed model.pt of step {saved_model['step']} with optim.pt of step {saved_optim['step']}",
                  flush=True)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    while step < args.steps:
        x = torch.randn(4, 8, generator=g)
        loss = model(x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        if step % args.every == 0 and rank == 0:
            torch.save({"step": step, "model": model.module.state_dict()}, model_path)
            print(f"[two] wrote model.pt of step {step}", flush=True)
            time.sleep(args.pause)  # gathering the optimizer state, say
            torch.save({"step": step, "optim": optim.state_dict()}, optim_path)
            print(f"[two] saved step {step}", flush=True)
        dist.barrier()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        print(f"[two] done step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
