"""Vertex AI's node contract (see cloudtrain/providers/local/node.py for what a contract module is: Python 3.8,
the standard library and cloudtrain's node side).

Everything from CLUSTER_SPEC (workerpool0 = the primary, workerpool1 = the other nodes). MASTER_ADDR/WORLD_SIZE are
not reliable there (some containers set WORLD_SIZE to the node count), so they are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLATFORM = "vertex"
SPOT_NOTICE = "gce"  # the metadata server's instance/preempted (cloudtrain/node/spot_notice.py)
CLUSTER_PORT = 2222  # the port Vertex writes into CLUSTER_SPEC


def detect(env: dict[str, str]) -> dict[str, Any]:
    try:
        spec = json.loads(env["CLUSTER_SPEC"])
        cluster, task = spec["cluster"], spec["task"]
        primary, workers = list(cluster["workerpool0"]), list(cluster.get("workerpool1", []))
        kind, index = task["type"], int(task["index"])
        host, _, port = primary[0].rpartition(":")
        master_port = int(port)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"CLUSTER_SPEC is not a Vertex cluster spec: {exc}") from None
    if kind == "workerpool0":
        rank = index
    elif kind == "workerpool1":
        rank = len(primary) + index
    else:
        raise ValueError(f"CLUSTER_SPEC task type {kind!r}: cloudtrain uses workerpool0 and workerpool1 only")
    return {"nnodes": len(primary) + len(workers), "node_rank": rank, "master_addr": host,
            "master_port": master_port, "rdzv": "static"}


def _spec(hosts: dict[str, Any], rank: int) -> str:
    task = {"type": "workerpool0", "index": 0} if rank == 0 else {"type": "workerpool1", "index": rank - 1}
    return json.dumps({"cluster": hosts, "task": task, "environment": "cloud"})


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    hosts: dict[str, Any] = {"workerpool0": [f"workerpool0-0:{CLUSTER_PORT}"]}
    if nnodes > 1:
        hosts["workerpool1"] = [f"workerpool1-{i}:{CLUSTER_PORT}" for i in range(nnodes - 1)]
    return {"CLUSTER_SPEC": _spec(hosts, rank)}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    hosts: dict[str, Any] = {"workerpool0": [f"127.0.0.1:{port}"]}
    if nnodes > 1:
        hosts["workerpool1"] = [f"127.0.0.1:{port}"] * (nnodes - 1)
    return {"CLUSTER_SPEC": _spec(hosts, rank)}, {}
