"""DDP the way the playbook teaches it: DistributedSampler, learning rate scaled by the world size, gradient
accumulation with no_sync, mixed precision with torch.amp, and TensorBoard written by rank 0 only.

Runs unchanged on CPU (gloo, bf16 autocast) and on GPUs (nccl, fp16 autocast with a GradScaler).

    cloudtrain submit examples/ddp_playbook.py --procs-per-node 2 -- --epochs 3 --logdir /tmp/tb
    tensorboard --logdir /tmp/tb
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup() -> torch.device:
    """nccl + cuda:LOCAL_RANK where there are GPUs, gloo + cpu elsewhere."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


class CommCounter:
    """State for the comm hook below: counts DDP's gradient all-reduces (one per bucket per synced backward)."""

    def __init__(self) -> None:
        self.calls = 0


def counting_allreduce(state, bucket):
    """DDP's default all-reduce, counted: shows that no_sync really skips the communication. (No annotations:
    DDP checks ``bucket``'s annotation object, which ``from __future__ import annotations`` turns into a string.)"""
    state.calls += 1
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default (whole) process group


def synthetic(samples: int, features: int) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16, help="per rank, per micro-batch")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--base-lr", type=float, default=0.01, help="for one process; scaled by the world size")
    p.add_argument("--logdir", default="tensorboard", help="TensorBoard event folder (rank 0 writes it)")
    args = p.parse_args()

    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    data = synthetic(args.samples, args.features)
    # Each rank sees a disjoint 1/world of every epoch; set_epoch reshuffles identically on every rank.
    sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0,
                                                          drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    net = nn.Sequential(nn.Linear(args.features, 64), nn.GELU(), nn.Linear(64, 1)).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    comms = CommCounter()
    model.register_comm_hook(comms, counting_allreduce)
    # Linear scaling rule: the global batch is world * batch * accumulate, so the step size grows with the world.
    lr = args.base_lr * world
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    # fp16 on GPUs needs loss scaling; bf16 (what CPUs autocast to) has fp32's range and needs none.
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    loss_fn = nn.MSELoss()

    writer = None
    if rank == 0:  # one writer: N ranks writing one folder would interleave N copies of every curve
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(args.logdir)
        writer.add_text("config", f"world_size={world} lr={lr} amp={amp_dtype} accumulate={args.accumulate}")
        print(f"ddp_playbook: world_size={world} backend={dist.get_backend()} lr={lr:g} (base {args.base_lr:g} x "
              f"{world}) amp={str(amp_dtype).removeprefix('torch.')} accumulate={args.accumulate}", flush=True)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, batches = torch.zeros((), device=device), 0
        opt.zero_grad(set_to_none=True)
        for i, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device), yb.to(device)
            boundary = (i + 1) % args.accumulate == 0
            # no_sync: backward only accumulates locally; the all_reduce happens once, on the boundary micro-batch.
            with model.no_sync() if not boundary else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=amp_dtype):
                    loss = loss_fn(model(xb).float(), yb)
                scaler.scale(loss / args.accumulate).backward()  # scaled by 1/accumulate: the mean over micro-batches
            total += loss.detach()
            batches += 1
            if boundary:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                step += 1
        dist.all_reduce(total)
        epoch_loss = total.item() / (batches * world)
        if writer is not None:
            writer.add_scalar("loss/train", epoch_loss, epoch)
            writer.add_scalar("lr", opt.param_groups[0]["lr"], epoch)
        if rank == 0:
            print(f"epoch {epoch} optimizer_steps={step} loss={epoch_loss:.6f}", flush=True)

    # DDP keeps replicas identical: gather a checksum of every rank's weights and compare.
    flat = torch.cat([q.detach().float().reshape(-1) for q in model.parameters()])
    sums = [torch.zeros(2, device=device) for _ in range(world)]
    dist.all_gather(sums, torch.stack([flat.sum(), flat.abs().sum()]))
    equal = all(torch.equal(s, sums[0]) for s in sums)
    if writer is not None:
        writer.close()
    if rank == 0:
        print(f"done: optimizer_steps={step} allreduce_calls={comms.calls} micro_batches={len(loader) * args.epochs} "
              f"weights_equal_across_ranks={equal} logdir={os.path.abspath(args.logdir)}", flush=True)
    # Tear down in order: every rank done with collectives, then DDP's reducer (it holds the comm hook and gloo
    # work) freed while its process group still exists, then the group. Left to interpreter exit, the reducer can be
    # destroyed after the group's threads and abort the process ("terminate called without an active exception").
    dist.barrier()
    del model, opt
    dist.destroy_process_group()
    if not equal:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
