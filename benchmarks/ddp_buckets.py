"""What fixing DDP's bucket layout at wrap time costs per training step, against plain DDP in the same run.

    python benchmarks/ddp_buckets.py [--world 2] [--layers 8] [--width 1024] [--rounds 5]

cloudtrain.runtime.wrap_model lays DDP's buckets out once, at wrap time (cloudtrain/runtime/model.py), so that a
resumed run reduces every step in the same layout as an uninterrupted one. Three models, alternating each round so
they share the machine's noise (gloo on CPU, one thread per rank):
- plain: torch's DDP (one bucket for the first step, then laid out again in gradient-arrival order);
- cloudtrain: what wrap_model builds (ddp_class() + fix_bucket_layout: last parameters first);
- definition order: fix_bucket_layout on plain DDP, whose first bucket holds the first parameters, the last
  gradients to arrive, so no bucket is reduced before the backward pass ends (why wrap_model uses ddp_class()).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloudtrain.runtime.model import ddp_class, fix_bucket_layout

STEPS = 3  # timed steps per model per round


def seconds_per_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    return (time.perf_counter() - start) / STEPS


def worker(rank: int, args: argparse.Namespace, init: str, report: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world)
    models = {}
    for name in ("plain", "cloudtrain", "definition order"):
        torch.manual_seed(0)
        layers = [m for _ in range(args.layers) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
        ddp = (ddp_class() if name == "cloudtrain" else DDP)(nn.Sequential(*layers))
        if name != "plain":
            fix_bucket_layout(ddp)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4))
    x = torch.randn(args.batch, args.width)
    for ddp, opt in models.values():  # warm-up; plain DDP lays its buckets out again after this first step
        seconds_per_step(ddp, opt, x)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (ddp, opt) in models.items():
            dist.barrier()
            times[name].append(seconds_per_step(ddp, opt, x))
    if rank == 0:
        median = {name: statistics.median(t) for name, t in times.items()}
        best = {name: min(t) for name, t in times.items()}  # the least disturbed round: steadier on a busy machine
        mb = sum(p.numel() for p in models["plain"][0].parameters()) * 4 / 2**20
        lines = [f"world {args.world}, {mb:.0f} MB of gradients, batch {args.batch}, {args.rounds} rounds of {STEPS} "
                 "steps; ms/step (ratio to plain DDP), median and best round"]
        lines += [f"{name:<18} median {median[name] * 1000:7.1f} ({median[name] / median['plain']:4.2f}x)   "
                  f"best {best[name] * 1000:7.1f} ({best[name] / best['plain']:4.2f}x)" for name in times]
        Path(report).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report")
        mp.spawn(worker, args=(args, f"file://{tmp}/rendezvous", report), nprocs=args.world)
        print(Path(report).read_text(), end="")


if __name__ == "__main__":
    main()
