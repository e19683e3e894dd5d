"""Point-to-point and collective communication on process groups (the playbook's first chapter).

Every rank checks each result against the value it must have and prints one line per operation; the last line,
from rank 0, says whether every rank agreed. Runs unchanged on CPU (gloo) and on GPUs (nccl, cuda:LOCAL_RANK).

    cloudtrain submit examples/collectives.py --nodes 2 --procs-per-node 1
    cloudtrain submit examples/collectives.py --nodes 2 --procs-per-node 2     # two-member sub-groups
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup() -> torch.device:
    """nccl + cuda:LOCAL_RANK where there are GPUs, gloo + cpu elsewhere; torchrun set RANK, WORLD_SIZE, MASTER_*."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def report(name: str, got: torch.Tensor, expected: torch.Tensor, failures: list[str]) -> None:
    ok = torch.equal(got.cpu(), expected.cpu())
    if not ok:
        failures.append(name)
    print(f"rank {dist.get_rank()} {name}: {got.cpu().tolist()} ok={ok}", flush=True)


def main() -> None:
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures: list[str] = []

    # -- point to point -------------------------------------------------------------------------------
    # Blocking send/recv: rank 0 hands a tensor to the last rank; the others go straight on.
    last = world - 1
    if rank == 0:
        dist.send(torch.tensor([42.0], device=device), dst=last)
    if rank == last:
        got = torch.zeros(1, device=device)
        dist.recv(got, src=0)
        report("send/recv", got, torch.tensor([42.0]), failures)

    # Non-blocking ring: each rank posts a send to its right and a receive from its left, then waits on both.
    # A ring where every rank sends first can deadlock: a send may wait for its matching receive, and NCCL runs a
    # rank's operations on one communicator in order. Even ranks send first and odd ranks receive first, so every
    # send meets a posted receive.
    # (dist.batch_isend_irecv is the other way out: NCCL then runs the batch as one group.)
    right, left = (rank + 1) % world, (rank - 1) % world
    outgoing = torch.tensor([float(rank)], device=device)
    incoming = torch.zeros(1, device=device)
    if rank % 2 == 0:
        requests = [dist.isend(outgoing, dst=right), dist.irecv(incoming, src=left)]
    else:
        requests = [dist.irecv(incoming, src=left), dist.isend(outgoing, dst=right)]
    for request in requests:
        if request is not None:  # None only for a rank outside the group
            request.wait()
    report("isend/irecv ring", incoming, torch.tensor([float(left)]), failures)

    # -- collectives on the default group ----------------------------------------------------------------
    value = torch.tensor([3.14 if rank == 0 else 0.0], device=device)
    dist.broadcast(value, src=0)
    report("broadcast", value, torch.tensor([3.14]), failures)

    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    report("all_reduce", value, torch.tensor([world * (world + 1) / 2]), failures)

    gathered = [torch.zeros(1, device=device) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank * 10)], device=device))
    report("all_gather", torch.cat(gathered), torch.tensor([float(r * 10) for r in range(world)]), failures)

    # reduce_scatter: every rank contributes a vector of `world` chunks; rank r keeps the sum of chunk r.
    contribution = torch.arange(world, dtype=torch.float32, device=device) + 100 * rank
    mine = torch.zeros(1, device=device)
    dist.reduce_scatter(mine, list(contribution.chunk(world)), op=dist.ReduceOp.SUM)
    report("reduce_scatter", mine, torch.tensor([float(rank * world + 100 * sum(range(world)))]), failures)

    # -- a sub-group made with new_group --------------------------------------------------------------
    # Every rank must call new_group for every group (it is a collective), even for groups it is not in.
    evens = dist.new_group(ranks=list(range(0, world, 2)))
    odds = dist.new_group(ranks=list(range(1, world, 2))) if world > 1 else None
    mine_group, members = (evens, list(range(0, world, 2))) if rank % 2 == 0 else (odds, list(range(1, world, 2)))
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value, group=mine_group)  # only the members take part; the other group runs independently
    report(f"subgroup{members} all_reduce", value, torch.tensor([float(sum(r + 1 for r in members))]), failures)
    other = odds if rank % 2 == 0 else evens
    outside = other is None or dist.get_rank(other) == -1  # a non-member has no rank in the group
    print(f"rank {rank} subgroup rank={dist.get_rank(mine_group)} size={dist.get_world_size(mine_group)} "
          f"not in other group={outside}", flush=True)
    if not outside:
        failures.append("membership")

    # -- did every rank pass? -------------------------------------------------------------------------
    failed = torch.tensor([len(failures)], device=device)
    dist.all_reduce(failed)
    if rank == 0:
        print(f"collectives: world_size={world} backend={dist.get_backend()} all_ok={int(failed.item()) == 0}",
              flush=True)
    dist.destroy_process_group()
    if failures:
        raise SystemExit(f"rank {rank}: wrong results: {failures}")


if __name__ == "__main__":
    main()
