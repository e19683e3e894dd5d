"""Each rank prints a turn in a fixed order across ranks, `pause` seconds apart: turn 0 of rank 0, turn 0 of rank 1,
turn 1 of rank 0, ... With one process per node, the nodes' logs interleave in a known order of time."""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
dist.barrier()
start = time.time()
for turn in range(3):
    time.sleep(max(0.0, start + (turn * world + rank) * pause - time.time()))
    print(f"turn {turn} rank {rank}", flush=True)
dist.barrier()
dist.destroy_process_group()
