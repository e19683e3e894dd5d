"""Joins the process group, says it is ready, then trains 'forever' (until cancelled)."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"ready rank={dist.get_rank()} world={dist.get_world_size()} pid={os.getpid()}", flush=True)
while True:
    time.sleep(0.5)
