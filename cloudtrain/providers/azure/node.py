"""Azure ML's node contract (see cloudtrain/providers/local/node.py for what a contract module is: Python 3.8,
the standard library and cloudtrain's node side).

With PyTorchDistribution(process_count_per_instance=1) the service sets MASTER_ADDR, MASTER_PORT and NODE_RANK per
node, and WORLD_SIZE counts its processes, which is one per node in that layout. cloudtrain's plan also sets
CLOUDTRAIN_NNODES, preferred where present. Azure ML uploads the job's ./outputs itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudtrain import contract

PLATFORM = "azureml"
SPOT_NOTICE = "azure"  # Scheduled Events' Preempt (cloudtrain/node/spot_notice.py): compute cluster nodes are Azure VMs
MASTER_PORT = 6105  # what Azure ML's PyTorch distribution sets


def detect(env: dict[str, str]) -> dict[str, Any]:
    nnodes = contract.env_int(env, contract.NNODES, contract.env_int(env, "WORLD_SIZE", 1))
    return {"nnodes": nnodes, "node_rank": contract.env_int(env, "NODE_RANK", 0),
            "master_addr": env.get("MASTER_ADDR", "127.0.0.1"),
            "master_port": contract.env_int(env, "MASTER_PORT", MASTER_PORT),
            "rdzv": "static"}


def outputs(env: dict[str, str], start_dir: Path) -> Path:
    """The folder Azure ML uploads to the workspace's default datastore: the job's own ./outputs."""
    return start_dir / "outputs"


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    return {"AZUREML_RUN_ID": job_id, "MASTER_ADDR": "<node 0>", "MASTER_PORT": str(MASTER_PORT),
            "NODE_RANK": str(rank), "WORLD_SIZE": str(nnodes)}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    return {"AZUREML_RUN_ID": job_id, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(rank),
            "WORLD_SIZE": str(nnodes), "RANK": str(rank), "LOCAL_RANK": "0", contract.NNODES: str(nnodes)}, {}
