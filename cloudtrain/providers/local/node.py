"""cloudtrain's own node contract: the variables the local provider (or any provider that sets them) gives each node.

A node contract module says how a node learns its place in the cluster from what its platform gives it, and how to
give the same to a node on this machine (``--emulate``). It runs first on every node, loaded by the bootstrap from
the bundle's lib/ by its file path: Python 3.8, the standard library and cloudtrain's node side (the bundle's lib/
holds it: ``cloudtrain.contract`` names cloudtrain's variables), nothing of the client side. The planner imports the
same module, so a plan's torchrun lines are what the nodes derive.

Every contract module has ``PLATFORM``, ``detect(env)``, ``planned(nnodes, rank, job_id, instance_type)`` and
``emulate(nnodes, rank, port, node_dir, job_id)``; optional: ``launcher_env(cluster, env)``,
``report_failure(env, message)`` and ``outputs(env, start_dir)`` (see the SageMaker and Azure ML ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudtrain import contract

PLATFORM = "local"


def detect(env: dict[str, str]) -> dict[str, Any]:
    """c10d ranks the agents by (address, pid). Every simulated node is on 127.0.0.1, so node 0 names itself by that
    address and the others as 'localhost' (which sorts after it): global rank 0 then lives on node 0, as on every
    cloud, where node 0 is the one that publishes a plain script's checkpoints. Only rank 0's address is ever
    connected to."""
    node_rank = contract.env_int(env, contract.NODE_RANK, 0)
    return {"nnodes": contract.env_int(env, contract.NNODES, 1), "node_rank": node_rank,
            "master_addr": env.get(contract.MASTER_ADDR, "127.0.0.1"),
            "master_port": contract.env_int(env, contract.MASTER_PORT, 29500), "rdzv": env.get(contract.RDZV, "c10d"),
            "local_addr": env.get(contract.LOCAL_ADDR, "127.0.0.1" if node_rank == 0 else "localhost")}


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    return emulate(nnodes, rank, 0, Path("."), job_id)[0]


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """The variables (and files: none here) node ``rank`` of ``nnodes`` sees, its rendezvous at 127.0.0.1:port."""
    return {contract.NNODES: str(nnodes), contract.NODE_RANK: str(rank), contract.MASTER_ADDR: "127.0.0.1",
            contract.MASTER_PORT: str(port), contract.RDZV: "c10d"}, {}
