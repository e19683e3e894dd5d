"""The toy scheduler's node contract: it tells each node TOY_NODE_INDEX, TOY_NODE_COUNT and TOY_HEAD (host:port of
node 0). Standard library only: it names none of cloudtrain's variables (a node contract that does imports them
from cloudtrain.contract, which the bundle's lib/ holds beside it: the bootstrap loads the contract from there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLATFORM = "toybatch"


def detect(env: dict[str, str]) -> dict[str, Any]:
    try:
        host, _, port = env["TOY_HEAD"].rpartition(":")
        return {"nnodes": int(env["TOY_NODE_COUNT"]), "node_rank": int(env["TOY_NODE_INDEX"]), "master_addr": host,
                "master_port": int(port), "rdzv": "static"}
    except (KeyError, ValueError) as exc:
        raise ValueError(f"not a toy batch node: {exc!r}") from None


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    return {"TOY_NODE_INDEX": str(rank), "TOY_NODE_COUNT": str(nnodes), "TOY_HEAD": "toy-node-0:4000"}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    return {"TOY_NODE_INDEX": str(rank), "TOY_NODE_COUNT": str(nnodes), "TOY_HEAD": f"127.0.0.1:{port}"}, {}
