"""Says it started, then computes for the number of seconds given without printing or checkpointing anything (a long
silent epoch), then agrees with its peers and exits 0: busy, never hung."""

import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)  # one core, as torchrun gives each of several processes: busy, not a whole machine
dist.init_process_group("gloo")
print(f"started rank={dist.get_rank()}", flush=True)
x = torch.randn(128, 128)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    x = torch.tanh(x @ x)
dist.all_reduce(x)
dist.destroy_process_group()
