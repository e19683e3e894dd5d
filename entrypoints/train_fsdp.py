"""Reference FSDP2 trainer: ``fully_shard`` per block, optional bf16 mixed precision, resumable after preemption.

Runs unchanged on CPU/gloo and on GPUs/nccl (device mesh and backend follow the environment). Checkpoints are
sharded (each rank writes its own shards) and reshard on load when the world size changed.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from cloudtrain.runtime import (
    Checkpointer,
    ResumableSampler,
    get_logger,
    init_distributed,
    make_loader,
    report_step,
    save_final_model,
    seed_everything,
    shutdown,
    wrap_model,
)


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
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to rehearse preemption)")
    args = p.parse_args()

    ctx = init_distributed()
    log = get_logger("train_fsdp")
    seed_everything(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, args.features, generator=g)
    data = TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))
    model = wrap_model(Model(args.features, args.width, args.depth), ctx, "fsdp", bf16=args.bf16)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = ResumableSampler(len(data), ctx.rank, ctx.world_size, seed=args.seed)
    ckpt = Checkpointer(model, opt, sampler=sampler, every_steps=args.checkpoint_every)
    step = ckpt.restore()
    log.info(f"training: fsdp world_size={ctx.world_size} backend={ctx.backend} bf16={args.bf16} start_step={step}")
    loss_fn = nn.MSELoss()
    loss = None  # the last step's; a run resumed at an epoch's end takes no step in that epoch (or at all)
    total = args.epochs * -(-sampler.per_rank // args.batch_size)  # steps in the whole run
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        first_step = step
        for xb, yb in make_loader(data, sampler, args.batch_size):
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb).float(), yb)
            loss.backward()
            opt.step()
            step += 1
            sampler.advance(len(xb))
            if args.step_sleep:
                time.sleep(args.step_sleep)
            ckpt.step(step)
            report_step(step, total)  # progress, steps/s and ETA in `cloudtrain status`
        if loss is not None and step > first_step:  # an epoch whose steps all ran before a resume: nothing to say
            log.info(f"epoch {epoch} step {step} loss {loss.item():.6f}")
    ckpt.close()  # saves the last step too: a run shorter than the checkpoint interval leaves one to resume from
    written = save_final_model(model)
    log.info(f"done: world_size={ctx.world_size} steps={step} final_loss={last_loss(loss)} model={written}")
    shutdown()


def last_loss(loss: torch.Tensor | None) -> str:
    return f"{loss.item():.6f}" if loss is not None else "n/a (every step ran before the resume)"


if __name__ == "__main__":
    main()
