"""Kubernetes' node contract (see cloudtrain/providers/local/node.py for what a contract module is: Python 3.8,
the standard library and cloudtrain's node side).

Both job kinds give every node's container the ``PET_*`` variables torchrun itself reads, and cloudtrain reads them
and never sets them (the Trainer's webhook refuses a TrainJob whose env names one):

- Kubeflow Trainer v2 ``TrainJob`` (torch plugin, pkg/runtime/framework/plugins/torch/torch.go): ``PET_NNODES``
  (trainer.numNodes), ``PET_NPROC_PER_NODE`` (trainer.numProcPerNode), ``PET_NODE_RANK`` (the pod's Job completion
  index), ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>`` (node 0's pod through the JobSet's headless
  service) and ``PET_MASTER_PORT`` = 29500.
- Training Operator v1 ``PyTorchJob`` (pkg/controller.v1/pytorch/envvar.go, master.go): the same ``PET_*`` names,
  with ``PET_MASTER_ADDR`` = ``<job>-master-0`` and ``PET_MASTER_PORT`` = the master's ``pytorchjob-port`` (23456 by
  default); it also sets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (replicas x nprocPerNode) and ``RANK`` (the
  node's rank, not a process's), which torchrun replaces for the processes it starts.

Ranks are static (the rank is the pod's index): no c10d race decides which node is rank 0. A pod replaced after a
node loss keeps its index, so it rejoins as the same node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudtrain import contract

PLATFORM = "kubernetes"
TRAINJOB_PORT = 29500  # constants.ContainerTrainerPort (kubeflow/trainer v2.3.0)
PYTORCHJOB_PORT = 23456  # PyTorchJobDefaultPort (Training Operator v1.9)
RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def _int(env: dict[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        raise ValueError(f"not a Kubeflow training pod: {name} is not set (the Trainer's torch plugin or the Training "
                         "Operator sets it)")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def detect(env: dict[str, str]) -> dict[str, Any]:
    nnodes, rank = _int(env, "PET_NNODES"), _int(env, "PET_NODE_RANK")
    if not 0 <= rank < nnodes:
        raise ValueError(f"PET_NODE_RANK={rank} is outside 0..{nnodes - 1} (PET_NNODES={nnodes})")
    master = env.get("PET_MASTER_ADDR")
    if not master:
        raise ValueError("not a Kubeflow training pod: PET_MASTER_ADDR is not set")
    return {"nnodes": nnodes, "node_rank": rank, "master_addr": master,
            "master_port": _int(env, "PET_MASTER_PORT"), "rdzv": "static"}


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    """What the Trainer's torch plugin gives the TrainJob's pod ``rank`` (PyTorchJob: see ``pytorchjob_env``)."""
    return {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": "<trainer.numProcPerNode>", "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": f"{job_id}-node-0-0.{job_id}", "PET_MASTER_PORT": str(TRAINJOB_PORT)}


def pytorchjob_env(nnodes: int, rank: int, job_id: str, nproc: int) -> dict[str, str]:
    """What Training Operator v1 gives the PyTorchJob's pod ``rank`` (Master is rank 0, Worker i is i + 1)."""
    master = f"{job_id}-master-0"
    return {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(PYTORCHJOB_PORT), "MASTER_ADDR": master,
            "MASTER_PORT": str(PYTORCHJOB_PORT), "WORLD_SIZE": str(nnodes * nproc), "RANK": str(rank)}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """The torch plugin's variables on this machine: node 0's service name does not resolve here, so the rendezvous
    is redirected to 127.0.0.1:port (CLOUDTRAIN_MASTER_OVERRIDE)."""
    env = planned(nnodes, rank, job_id)
    env["PET_NPROC_PER_NODE"] = "auto"
    env[contract.MASTER_OVERRIDE] = f"127.0.0.1:{port}"
    return env, {}
