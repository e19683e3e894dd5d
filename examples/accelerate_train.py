"""A plain Hugging Face Accelerate script, with nothing cloudtrain-specific in it.

``Accelerator()`` reads the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) and picks
the rest itself: multi-GPU with nccl on cuda:LOCAL_RANK where there are GPUs. ``prepare`` wraps the model in DDP
and shards the DataLoader by rank; ``accelerator.backward`` replaces ``loss.backward()``. The same file runs under
``accelerate launch`` or ``torchrun`` without changes.

On a machine without GPUs, Accelerate goes multi-process (gloo) only when asked to use the CPU: set
``ACCELERATE_USE_CPU=1`` in the job's environment, which is what ``accelerate launch --cpu`` does. Without it every
process would train alone, so the script refuses to start in that case.

    cloudtrain submit examples/accelerate_train.py --procs-per-node 2 -- --epochs 3                  # GPUs
    cloudtrain submit examples/accelerate_train.py --procs-per-node 2 --env ACCELERATE_USE_CPU=1     # CPU only
"""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def synthetic(samples: int, features: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    return TensorDataset(x, x @ torch.randn(features, 1, generator=g) + 0.05 * torch.randn(samples, 1, generator=g))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--lr", type=float, default=0.02)
    args = p.parse_args()

    accelerator = Accelerator()
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched:  # e.g. CPU-only without ACCELERATE_USE_CPU: N separate trainings
        raise SystemExit(f"Accelerate sees {accelerator.num_processes} process(es) but the launcher started "
                         f"{launched}; on a machine without GPUs set ACCELERATE_USE_CPU=1")
    set_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(synthetic(args.samples, 16), batch_size=args.batch_size, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    accelerator.print(f"accelerate: distributed_type={accelerator.distributed_type.value} "
                      f"num_processes={accelerator.num_processes} device={accelerator.device.type} "
                      f"backend={torch.distributed.get_backend()} batches_per_process={len(loader)}")

    losses: list[float] = []
    for epoch in range(args.epochs):
        model.train()
        total, batches = torch.zeros((), device=accelerator.device), 0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            total += loss.detach()
            batches += 1
        losses.append(accelerator.reduce(total / batches, reduction="mean").item())  # mean over processes
        accelerator.print(f"epoch {epoch} loss={losses[-1]:.6f}")

    # the replicas must be identical: gather a checksum of every process's weights
    flat = torch.cat([q.detach().reshape(-1) for q in accelerator.unwrap_model(model).parameters()])
    checksums = accelerator.gather(torch.stack([flat.sum(), flat.abs().sum()]).unsqueeze(0))
    equal = bool((checksums == checksums[0]).all())
    accelerator.print(f"done: num_processes={accelerator.num_processes} weights_equal_across_ranks={equal} "
                      f"loss_first={losses[0]:.6f} loss_last={losses[-1]:.6f}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not equal:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
