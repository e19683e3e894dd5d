"""Slurm's node contract (see cloudtrain/providers/local/node.py for what a contract module is: Python 3.8,
the standard library and cloudtrain's node side).

The batch script starts one ``srun`` task per node; each reads its place from what Slurm gives a task:
SLURM_NODEID (the rank), SLURM_NNODES, SLURM_JOB_NODELIST (expanded as ``scontrol show hostnames`` does; the first
host is the rendezvous host) and SLURM_JOB_ID. The batch script runs ``srun`` on the first node, so
SLURM_LAUNCH_NODE_IPADDR is that node's address as Slurm itself reaches it; where it is unset, the first host's name.
The rendezvous port comes from the job id and SLURM_RESTART_COUNT: the same on every node, without a file or a
network call, and another one after a requeue. Several slurmd may share a host (and its ``hostname``), so a node's
name is SLURMD_NODENAME.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cloudtrain import contract

PLATFORM = "slurm"
PORT_BASE, PORT_SPAN = 20000, 12000  # rendezvous ports 20000-31999: below Linux's ephemeral range
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """``a[1-2],b`` -> ``['a[1-2]', 'b']``: commas outside brackets separate names."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    return [p for p in [*parts, current] if p]


def _numbers(group: str, text: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']``: a range keeps the width of its first number (zero padding)."""
    found = []
    for item in group.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"{item!r} in host list {text!r} is not a number or a range")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} in host list {text!r} runs backwards")
        width = len(low) if low.startswith("0") else 0
        found += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return found


def _expand_one(name: str, text: str, after: bool = False) -> list[str]:
    start = name.find("[")
    if start < 0:
        if after and name:  # as Slurm: text may follow a range only before another range
            raise ValueError(f"{text!r} is not a Slurm host list: {name!r} follows a range")
        return [name]
    end = name.index("]", start)
    rest = _expand_one(name[end + 1:], text, after=True)
    return [f"{name[:start]}{n}{tail}" for n in _numbers(name[start + 1:end], text) for tail in rest]


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact host list as ``scontrol show hostnames`` prints it, one host per entry, in order:
    ``gpu[01-03,7],login`` -> gpu01, gpu02, gpu03, gpu7, login; ``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2."""
    return [host for name in _split_top(text.strip()) for host in _expand_one(name, text)]


def rendezvous_port(job_id: str, restarts: int) -> int:
    """The same on every node of a run; another after a requeue (the last run's may linger in TIME_WAIT)."""
    number = int(job_id) if job_id.isdigit() else 0
    return PORT_BASE + (number * 7 + restarts) % PORT_SPAN


def _int(env: dict[str, str], *names: str) -> int:
    for name in names:
        raw = env.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
    raise ValueError(f"not a Slurm task: {names[0]} is not set (run through srun in a Slurm job)")


def detect(env: dict[str, str]) -> dict[str, Any]:
    nnodes = _int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    rank = _int(env, "SLURM_NODEID")
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not listed:
        raise ValueError("not a Slurm task: SLURM_JOB_NODELIST is not set")
    hosts = expand_hostlist(listed)
    if len(hosts) != nnodes:
        raise ValueError(f"SLURM_JOB_NODELIST={listed!r} names {len(hosts)} hosts, SLURM_NNODES={nnodes}")
    name = env.get("SLURMD_NODENAME")
    if name and 0 <= rank < nnodes and hosts[rank] != name:
        raise ValueError(f"SLURMD_NODENAME={name!r} is not host {rank} of {listed!r} (SLURM_NODEID={rank})")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    return {"nnodes": nnodes, "node_rank": rank, "master_addr": env.get("SLURM_LAUNCH_NODE_IPADDR") or hosts[0],
            "master_port": rendezvous_port(job_id, restarts), "rdzv": "static"}


def _hosts(nnodes: int) -> tuple[list[str], str]:
    hosts = [f"node{i + 1}" for i in range(nnodes)]
    return hosts, f"node[1-{nnodes}]" if nnodes > 1 else "node1"


def planned(nnodes: int, rank: int, job_id: str, instance_type: str = "") -> dict[str, str]:
    """What Slurm gives the task on node ``rank`` (host names and the job id are the cluster's: shown as
    node1..nodeN, and the port as for job id 0)."""
    hosts, listed = _hosts(nnodes)
    return {"SLURM_JOB_ID": "<at submit>", "SLURM_NODEID": str(rank), "SLURM_NNODES": str(nnodes),
            "SLURM_JOB_NODELIST": listed, "SLURMD_NODENAME": hosts[rank],
            "SLURM_LAUNCH_NODE_IPADDR": "<node1's address>"}


def emulate(nnodes: int, rank: int, port: int, node_dir: Path, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """Slurm's variables on this machine; node1 does not resolve here, so the rendezvous is redirected to
    127.0.0.1:port (CLOUDTRAIN_MASTER_OVERRIDE)."""
    hosts, listed = _hosts(nnodes)
    return {"SLURM_JOB_ID": "1", "SLURM_NODEID": str(rank), "SLURM_NNODES": str(nnodes),
            "SLURM_JOB_NODELIST": listed, "SLURMD_NODENAME": hosts[rank], "SLURM_RESTART_COUNT": "0",
            contract.MASTER_OVERRIDE: f"127.0.0.1:{port}"}, {}
