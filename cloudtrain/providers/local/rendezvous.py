"""Where a local job's nodes meet: a free port on 127.0.0.1, and each node's contract variables naming it.

Submit chooses the port (a plan binds nothing) and the supervisor chooses again when another process took it
between that choice and node 0's torchrun binding it (on a busy machine, any process's ephemeral port can be it):
the nodes then report the diagnosis ``PORT_IN_USE`` and start over on a new port, which is no restart of the job.
"""

from __future__ import annotations

import socket
from pathlib import Path

from cloudtrain import registry

PORT_RETRIES = 3  # times a job's nodes start over on a new port before its failure stands


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def contract_env(contract_name: str, nnodes: int, port: int, job_dir: Path, job_id: str) -> dict[str, dict[str, str]]:
    """{node rank: the variables its platform's contract gives it}, the rendezvous at 127.0.0.1:``port``."""
    module = registry.node_contract(contract_name)
    return {str(rank): module.emulate(nnodes, rank, port, job_dir / f"node-{rank}", job_id)[0]
            for rank in range(nnodes)}


def naming(rendezvous: str, port: int) -> str:
    """A plan's rendezvous line (``c10d at 127.0.0.1, on a free port chosen at submit``) or a record's (``c10d at
    127.0.0.1:41234``) naming ``port`` instead."""
    where = rendezvous.split(", on")[0]
    host, colon, _ = where.rpartition(":")
    return f"{host if colon else where}:{port}"
