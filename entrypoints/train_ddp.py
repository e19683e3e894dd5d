"""Reference DDP trainer on a small synthetic regression task, resumable after preemption.

Runs unchanged on CPU/gloo and on GPUs/nccl. Checkpoints go where the job spec says (CLOUDTRAIN_CHECKPOINT_URI);
on SIGTERM it saves, uploads and exits "preempted"; restarted, it resumes bitwise where it stopped.
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


def synthetic_data(samples: int, features: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) + 0.01 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to rehearse preemption)")
    args = p.parse_args()

    ctx = init_distributed()
    log = get_logger("train_ddp")
    seed_everything(args.seed)
    data = synthetic_data(args.samples, args.features, args.seed)
    model = wrap_model(nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)),
                       ctx, "ddp")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    sampler = ResumableSampler(len(data), ctx.rank, ctx.world_size, seed=args.seed)
    ckpt = Checkpointer(model, opt, scheduler=sched, sampler=sampler, every_steps=args.checkpoint_every)
    step = ckpt.restore()
    log.info(f"training: world_size={ctx.world_size} backend={ctx.backend} device={ctx.device} start_step={step}")
    loss_fn = nn.MSELoss()
    loss = None  # the last step's; a run resumed at an epoch's end takes no step in that epoch (or at all)
    total = args.epochs * -(-sampler.per_rank // args.batch_size)  # steps in the whole run
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        first_step = step
        for x, y in make_loader(data, sampler, args.batch_size):
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            sampler.advance(len(x))
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
