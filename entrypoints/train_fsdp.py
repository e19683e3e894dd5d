"""Reference FSDP2 trainer: per-block sharding with ``fully_shard``, optional bf16 mixed precision.

Runs unchanged on CPU/gloo and on GPUs/nccl (device mesh and backend follow the environment).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from cloudtrain.runtime import init_distributed, shutdown


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width * 2), nn.GELU(),
                                 nn.Linear(width * 2, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class Model(nn.Module):
    def __init__(self, features: int, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--bf16", action="store_true", help="bf16 parameters/compute, fp32 gradient reduction")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    ctx = init_distributed()
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.features, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = Model(args.features, args.width, args.depth).to(ctx.device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else None
    kwargs = {"mesh": mesh, **({"mp_policy": mp} if mp else {})}
    for block in model.blocks:  # one FSDP unit per block: all-gathers overlap with the previous block's compute
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    if ctx.is_main:
        print(f"training: fsdp world_size={ctx.world_size} backend={ctx.backend} bf16={args.bf16}", flush=True)
    first = last = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=ctx.device)
        for xb, yb in loader:
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb).float(), yb)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=ctx.device)])
        torch.distributed.all_reduce(total)
        last = (total[0] / total[1]).item()
        first = last if first is None else first
        if ctx.is_main:
            print(f"epoch {epoch} loss {last:.6f}", flush=True)
    if ctx.is_main:
        print(f"done: world_size={ctx.world_size} first_loss={first:.6f} final_loss={last:.6f}", flush=True)
    shutdown()


if __name__ == "__main__":
    main()
