"""Prints a line every half second for the number of seconds given, then exits 0: busy, never idle."""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    print(f"rank {dist.get_rank()} working", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()
