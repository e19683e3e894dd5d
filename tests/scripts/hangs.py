"""Joins the process group, says it started, then hangs: no output and no checkpoint from then on."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"started rank={dist.get_rank()}", flush=True)
while True:
    time.sleep(1)
