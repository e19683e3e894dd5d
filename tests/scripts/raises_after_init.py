"""Fails in user code after joining the process group, as most real failures do: the last rank cannot read its data
and raises a chained exception (torch now prefixes its traceback with ``[rankN]: ``). The other ranks wait in a
barrier, which fails with "Connection closed by peer" once that rank is gone; with ``sleep`` they sleep instead
(they are stopped, not failed, when that rank's node fails)."""

import sys
import time

import torch.distributed as dist


def load(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise RuntimeError(f"dataset not found at {path}") from exc


dist.init_process_group("gloo")
if dist.get_rank() == dist.get_world_size() - 1:
    time.sleep(0.5)  # the others are waiting by now
    load("/nonexistent/train.bin")
if sys.argv[1:] == ["sleep"]:
    time.sleep(120)
dist.barrier()
