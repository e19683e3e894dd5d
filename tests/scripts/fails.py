"""Fails in user code on rank 1 only."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1: simulated bug", flush=True)
    sys.exit(3)
dist.barrier()
