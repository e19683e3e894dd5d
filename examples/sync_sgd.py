"""Synchronous SGD by hand (all_reduce the gradients, divide by the world size) against DDP on the same data.

Each rank trains on its own slice of one dataset. Two copies of one model are trained side by side: one averages
its gradients by hand, the other is wrapped in DistributedDataParallel. Both see the same batches, so they must end
with the same weights; rank 0 also replays the run on one process (full global batches) as a third witness.

    cloudtrain submit examples/sync_sgd.py --procs-per-node 2 -- --steps 30
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup() -> torch.device:
    """nccl + cuda:LOCAL_RANK where there are GPUs, gloo + cpu elsewhere."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        # Bitwise comparisons need deterministic kernels (TF32 and cuBLAS heuristics would differ per copy).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def dataset(samples: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same synthetic regression data on every rank (a fixed seed), so any rank can slice any part of it."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(samples, 1, generator=g)
    return x, y


def partition(n: int, rank: int, world: int) -> slice:
    """Contiguous, equal shards (the tail that does not divide evenly is dropped, as DistributedSampler does)."""
    per_rank = n // world
    return slice(rank * per_rank, (rank + 1) * per_rank)


def average_gradients(model: nn.Module, world: int) -> None:
    """The whole of data-parallel SGD: sum every gradient over the ranks, then divide by how many there are."""
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset(args.samples, args.features)
    shard = partition(len(x), rank, world)
    x_mine, y_mine = x[shard].to(device), y[shard].to(device)

    torch.manual_seed(0)  # same initial weights on every rank (DDP would broadcast rank 0's anyway)
    reference = nn.Sequential(nn.Linear(args.features, 32), nn.Tanh(), nn.Linear(32, 1))
    by_hand = copy.deepcopy(reference).to(device)
    ddp = DDP(copy.deepcopy(reference).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt_hand = torch.optim.SGD(by_hand.parameters(), lr=args.lr)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    per_rank = len(x_mine)
    first = last = 0.0
    for step in range(args.steps):
        start = (step * args.batch_size) % (per_rank - args.batch_size + 1)
        xb, yb = x_mine[start:start + args.batch_size], y_mine[start:start + args.batch_size]

        opt_hand.zero_grad()
        loss = loss_fn(by_hand(xb), yb)
        loss.backward()
        average_gradients(by_hand, world)
        opt_hand.step()

        opt_ddp.zero_grad()
        loss_fn(ddp(xb), yb).backward()  # DDP all-reduces (and averages) the gradients during backward
        opt_ddp.step()

        # the global loss: the mean of the ranks' losses (equal batch sizes)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        global_loss /= world
        first = global_loss.item() if step == 0 else first
        last = global_loss.item()

    diff = max_diff(by_hand, ddp.module)
    bitwise = all(torch.equal(a, b) for a, b in zip(by_hand.parameters(), ddp.module.parameters(), strict=True))
    # every rank must hold the same weights: compare each rank's vector with rank 0's
    flat = torch.cat([q.detach().reshape(-1) for q in by_hand.parameters()])
    rank0 = flat.clone()
    dist.broadcast(rank0, src=0)
    same_across = bool(torch.equal(flat, rank0))
    print(f"rank {rank}: hand vs ddp max_abs_diff={diff:.3e} bitwise={bitwise} same_as_rank0={same_across}",
          flush=True)

    if rank == 0:
        # Single-process replay: each step's global batch is the ranks' batches together; the mean loss over it
        # has the averaged gradient, so plain SGD must land on the same weights (up to summation order).
        single = copy.deepcopy(reference).to(device)
        opt_single = torch.optim.SGD(single.parameters(), lr=args.lr)
        shards = [partition(len(x), r, world) for r in range(world)]
        for step in range(args.steps):
            start = (step * args.batch_size) % (per_rank - args.batch_size + 1)
            xb = torch.cat([x[s][start:start + args.batch_size] for s in shards]).to(device)
            yb = torch.cat([y[s][start:start + args.batch_size] for s in shards]).to(device)
            opt_single.zero_grad()
            loss_fn(single(xb), yb).backward()
            opt_single.step()
        print(f"sync_sgd: world_size={world} steps={args.steps} loss_first={first:.6f} loss_last={last:.6f} "
              f"hand_vs_ddp_max_abs_diff={diff:.3e} hand_vs_ddp_bitwise={bitwise} "
              f"hand_vs_single_process_max_abs_diff={max_diff(by_hand, single):.3e}", flush=True)
    dist.barrier()  # as in ddp_playbook.py: free DDP's reducer while its group exists, then the group
    del ddp
    dist.destroy_process_group()
    if diff > 1e-6 or not same_across:
        raise SystemExit(f"rank {rank}: hand-averaged SGD and DDP disagree (max_abs_diff={diff})")


if __name__ == "__main__":
    main()
