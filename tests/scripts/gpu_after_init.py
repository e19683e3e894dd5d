"""The pattern of karpathy/nanoGPT's train.py run with --backend=gloo --device=cpu: it joins the process group, then
pins a CUDA device whatever --device says. On a machine without CUDA that dies with torch's ``[rankN]: `` prefix on
the traceback (module 'torch._C' has no attribute '_cuda_setDevice')."""

import os

import torch
from torch.distributed import init_process_group

init_process_group(backend="gloo")
torch.cuda.set_device(f"cuda:{os.environ['LOCAL_RANK']}")
print("training on", torch.cuda.current_device(), flush=True)
