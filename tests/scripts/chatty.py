"""Rank 0 prints a line every half second for the number of seconds given (the others print nothing, as many
scripts do), all exit 0: busy, never idle."""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if dist.get_rank() == 0:
        print("rank 0 working", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()
