"""The pattern of pytorch/examples ddp-tutorial-series/multinode.py: pins a GPU first, then joins with NCCL. On a
machine without CUDA it dies in set_device (module 'torch._C' has no attribute '_cuda_setDevice')."""

import os

import torch
from torch.distributed import init_process_group


def ddp_setup() -> None:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


if __name__ == "__main__":
    ddp_setup()
    print("training on", torch.cuda.current_device(), flush=True)
