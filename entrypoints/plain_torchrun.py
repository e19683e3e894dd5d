"""A plain torchrun script that knows nothing of cloudtrain: it reads what torchrun sets and all-reduces."""

import os

import torch
import torch.distributed as dist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    print(f"rank {rank}/{world} group_rank={os.environ.get('GROUP_RANK')} sum={value.item():.0f}", flush=True)
    if rank == 0:
        print(f"all_reduce ok: {value.item() == expected} world_size={world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
