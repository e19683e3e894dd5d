"""A deadlock in a collective: rank 0 enters all_reduce, rank 1 never does (it waits on an event nobody sets, as a
stuck data loader would). The process group's timeout is a day, so gloo itself never gives up."""

import datetime
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(days=1))
print(f"started rank={dist.get_rank()}", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))
else:
    threading.Event().wait()
