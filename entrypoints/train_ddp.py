"""Reference DDP trainer on a small synthetic regression task.

Runs unchanged on CPU/gloo and on GPUs/nccl: cloudtrain.runtime picks the backend and device from the environment.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from cloudtrain.runtime import init_distributed, shutdown


def synthetic_data(samples: int, features: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    true_w = torch.randn(features, 1, generator=g)
    y = x @ true_w + 0.01 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def make_model(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    ctx = init_distributed()
    torch.manual_seed(args.seed)
    data = synthetic_data(args.samples, args.features, args.seed)
    sampler = DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = make_model(args.features, args.hidden).to(ctx.device)
    ddp = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    if ctx.is_main:
        print(f"training: world_size={ctx.world_size} backend={ctx.backend} device={ctx.device}", flush=True)
    first = last = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=ctx.device)
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=ctx.device)])
        torch.distributed.all_reduce(total)
        epoch_loss = (total[0] / total[1]).item()
        first = epoch_loss if first is None else first
        last = epoch_loss
        if ctx.is_main:
            print(f"epoch {epoch} loss {epoch_loss:.6f}", flush=True)
    if ctx.is_main:
        print(f"done: world_size={ctx.world_size} first_loss={first:.6f} final_loss={last:.6f}", flush=True)
    shutdown()


if __name__ == "__main__":
    main()
