"""FSDP2: ``fully_shard`` on each block and then the root, bf16 mixed precision, and sharded checkpoints that
survive preemption through cloudtrain's runtime helpers.

Each rank holds 1/world of every parameter (a DTensor shard). Before a block runs, its parameters are all-gathered
(in bf16); after backward, its gradients are reduce-scattered (in fp32). Sharding block by block lets the next
block's all-gather overlap the current block's compute, and frees each block's full weights as soon as it is done.

Checkpoints go where the job says (``--checkpoint-uri``); submit again with more epochs and it resumes from the
newest one, resharding if the world size changed. Runs unchanged on CPU (gloo) and on GPUs (nccl).

    cloudtrain submit examples/fsdp2_checkpoint.py --procs-per-node 2 --checkpoint-uri file:///tmp/ckpt -- --epochs 2
    cloudtrain submit examples/fsdp2_checkpoint.py --procs-per-node 2 --checkpoint-uri file:///tmp/ckpt -- --epochs 3
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset

from cloudtrain.runtime import (
    Checkpointer,
    ResumableSampler,
    get_logger,
    init_distributed,
    make_loader,
    save_final_model,
    seed_everything,
    shutdown,
)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


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


def shard(model: Model, world_size: int, device_type: str, bf16: bool) -> Model:
    mesh = init_device_mesh(device_type, (world_size,))
    # bf16 for parameters and compute, fp32 for the gradient reduction (summing many ranks in bf16 loses bits).
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for block in model.blocks:  # one FSDP unit per block: its own all-gather and reduce-scatter
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root takes what is left (inp, out)
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32")
    p.add_argument("--checkpoint-every", type=int, default=8, help="steps between checkpoints")
    args = p.parse_args()

    ctx = init_distributed()  # nccl + cuda:LOCAL_RANK on GPUs, gloo + cpu elsewhere
    log = get_logger("fsdp2")
    seed_everything(0)  # same initial full weights on every rank; each then keeps only its shard
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.features, generator=g)
    data = TensorDataset(x, x @ torch.randn(args.features, 1, generator=g) / args.features ** 0.5)

    model = shard(Model(args.features, args.width, args.depth).to(ctx.device), ctx.world_size, ctx.device.type,
                  args.bf16)
    weight = model.blocks[0].mlp[0].weight  # type: ignore[index,union-attr]  # fully_shard's return type is loose
    assert isinstance(weight, DTensor)
    log.info(f"fsdp2: world_size={ctx.world_size} backend={ctx.backend} blocks={len(model.blocks)} "
             f"block0 weight: full {tuple(weight.shape)} local shard {tuple(weight.to_local().shape)} "
             f"stored {str(weight.dtype).removeprefix('torch.')}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)  # optimizer state is sharded like the parameters

    sampler = ResumableSampler(len(data), ctx.rank, ctx.world_size, seed=0)
    ckpt = Checkpointer(model, opt, sampler=sampler, every_steps=args.checkpoint_every)
    step = ckpt.restore()  # 0, or the newest complete checkpoint's step (model, optimizer, sampler, RNG)
    log.info(f"start_step={step} start_epoch={sampler.epoch}")

    loss_fn = nn.MSELoss()
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for xb, yb in make_loader(data, sampler, args.batch_size):
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            out = model(xb)  # bf16 when mixed precision is on
            loss = loss_fn(out.float(), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            sampler.advance(len(xb))
            ckpt.step(step)  # saves every --checkpoint-every steps; on SIGTERM saves and exits "preempted"
            total, batches = total + loss.item(), batches + 1
        if batches:  # zero when resuming from a checkpoint taken at the very end of this epoch
            log.info(f"epoch {epoch} step {step} loss {total / batches:.6f} "
                     f"compute_dtype={str(out.dtype).removeprefix('torch.')}")
    ckpt.save(step, block=True)  # the final state too, so a longer run resumes exactly here
    ckpt.close()
    written = save_final_model(model)  # full (unsharded) weights from rank 0, when the job has an output URI
    log.info(f"done: steps={step} final_checkpoint=step-{step} model={written}")
    shutdown()


if __name__ == "__main__":
    main()
