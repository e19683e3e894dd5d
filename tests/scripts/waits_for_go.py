"""Joins the process group, says it is ready, and finishes (exit 0) once the file named by its argument exists."""

import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"ready rank={dist.get_rank()} pid={os.getpid()}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
print(f"done rank={os.environ['RANK']}", flush=True)
