"""Process-group setup from the environment torchrun provides: nccl and cuda:LOCAL_RANK on GPUs, gloo on CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cloudtrain import contract


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: Any  # torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_backend_and_device(local_rank: int) -> tuple[str, Any]:
    import torch

    if torch.cuda.is_available() and os.environ.get(contract.FORCE_CPU) != "1":
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def init_distributed() -> DistContext:
    """Join the job's process group (idempotent). Works for a single process without torchrun too."""
    import torch.distributed as dist

    from cloudtrain.node.exit_guard import install

    install()  # outside a cloudtrain node too: gloo's threads finish before the interpreter shuts down
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend, device = pick_backend_and_device(local_rank)
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python train.py`: a world of one
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return DistContext(rank=dist.get_rank(), local_rank=local_rank, world_size=dist.get_world_size(),
                       backend=backend, device=device)


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
