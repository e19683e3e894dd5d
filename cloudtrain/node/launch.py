"""A node's launch, derived: its command line (what follows ``python bootstrap.py``), its place in the cluster under the
platform's node contract (the provider's node.py), and the torchrun line that follows from both.

Pure (no I/O but reading a contract's inputs), so the planner imports it (cloudtrain/platforms/node_commands.py) and a
plan's torchrun lines are the ones the nodes run; the node entry (cloudtrain/node/entry.py) runs the same code from
the bundle's lib/. Standard library only, Python 3.8.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cloudtrain.contract import MASTER_OVERRIDE
from cloudtrain.errors import NodeStartError

PLAIN_CONTRACT = "cloudtrain/providers/local/node.py"  # cloudtrain's own node contract, under the bundle's lib/


@dataclass(frozen=True)
class ClusterInfo:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    nproc_per_node: int
    rdzv: str  # "c10d" (ranks by arrival) or "static" (the provider fixes node ranks)
    platform: str
    local_addr: str | None = None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """A node's command line (``python bootstrap.py ARGS``), as the node entry reads it: the options, then the
    script's own arguments after ``--``."""
    user_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, user_args = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(prog="bootstrap.py", description="cloudtrain in-node bootstrap")
    p.add_argument("--bundle", required=True, help="bundle.tar.gz path or file:// URI (or its folder)")
    p.add_argument("--digest", help="expected sha256:<hex> of the bundle")
    p.add_argument("--workdir", required=True, help="where the bundle is unpacked")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--script")
    target.add_argument("--module")
    p.add_argument("--nproc-per-node", default="auto")
    p.add_argument("--job-id", default="cloudtrain")
    p.add_argument("--requirements-file")
    p.add_argument("--requirement", action="append", default=[])
    p.add_argument("--resume-arg", action="append", default=[], metavar="ARG",
                   help="added to the script's arguments when a checkpoint was restored (write --resume-arg=--x)")
    p.add_argument("--status-file", help="write the node's outcome here as JSON")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="export to the workers; for values only the platform's command line can resolve "
                        "(Azure ML substitutes ${{inputs.x}} in the command, not in environment variables)")
    p.add_argument("--node-contract", default=PLAIN_CONTRACT, metavar="PATH",
                   help="the platform's node contract module, as a path under the bundle's lib/ (default: "
                        "cloudtrain's own, the local provider's)")
    return p.parse_args(argv), user_args


def visible_gpus(env: dict[str, str]) -> int:
    """GPUs this node may use, without importing torch: CUDA_VISIBLE_DEVICES, else the driver's device list."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    proc = Path("/proc/driver/nvidia/gpus")
    return len(list(proc.iterdir())) if proc.is_dir() else 0


def resolve_nproc(requested: str, env: dict[str, str]) -> int:
    if requested == "auto":
        return visible_gpus(env) or 1
    try:
        value = int(requested)
    except ValueError:
        raise NodeStartError(f"--nproc-per-node must be 'auto' or an integer, got {requested!r}") from None
    if value < 1:
        raise NodeStartError("--nproc-per-node must be >= 1")
    return value


def load_contract(path: Path) -> Any:
    """A node contract module (a provider's node.py, shipped in the bundle's lib/), loaded from its file: it imports
    the standard library and cloudtrain's node side (cloudtrain.contract, from that lib/), and no package of it is
    imported (its folder's __init__ may need more than Python 3.8 has)."""
    if not path.is_file():
        raise NodeStartError(f"node contract {path} is not in the bundle")
    spec = importlib.util.spec_from_file_location(f"cloudtrain_node_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        raise NodeStartError(f"node contract {path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detect_cluster(contract: Any, env: dict[str, str], nproc_request: str = "auto") -> ClusterInfo:
    """This node's place in the cluster, as its platform's contract reads it from ``env``."""
    nproc = resolve_nproc(nproc_request, env)
    try:
        found = contract.detect(env)
        cluster = ClusterInfo(nnodes=int(found["nnodes"]), node_rank=int(found["node_rank"]),
                              master_addr=str(found["master_addr"]), master_port=int(found["master_port"]),
                              nproc_per_node=nproc, rdzv=str(found.get("rdzv", "static")), platform=contract.PLATFORM,
                              local_addr=found.get("local_addr"))
    except (ValueError, KeyError, TypeError) as exc:
        raise NodeStartError(str(exc)) from None
    if not 0 <= cluster.node_rank < cluster.nnodes:
        raise NodeStartError(f"node rank {cluster.node_rank} is outside 0..{cluster.nnodes - 1}")
    return cluster


def launcher_env(contract: Any, cluster: ClusterInfo, env: dict[str, str]) -> dict[str, str]:
    """The variables the platform's own launcher gives the processes it starts (the contract's ``launcher_env``), so
    scripts written for that platform run unchanged here; a variable the job already sets (the spec's env) wins."""
    hook = getattr(contract, "launcher_env", None)
    found = hook(asdict(cluster), env, visible_gpus(env)) if hook else {}
    return {key: value for key, value in found.items() if key not in env}


def reachable(cluster: ClusterInfo, env: dict[str, str]) -> ClusterInfo:
    """Where torchrun really connects. Only local emulation sets CLOUDTRAIN_MASTER_OVERRIDE (algo-1:7777 does not
    resolve on a laptop, and fixed ports collide between jobs); on a cloud node it is the derived address."""
    override = env.get(MASTER_OVERRIDE)
    if not override:
        return cluster
    host, _, port = override.rpartition(":")
    return replace(cluster, master_addr=host, master_port=int(port), local_addr=host)


def target(args: argparse.Namespace, user_args: list[str]) -> list[str]:
    """What torchrun starts: ``[script, *args]`` or ``['-m', module, *args]``."""
    return [args.script, *user_args] if args.script else ["-m", args.module, *user_args]


def torchrun_argv(cluster: ClusterInfo, target: list[str], job_id: str, python: str = "python3",
                  workdir: str | None = None) -> list[str]:
    """The torchrun command line for this node. ``target`` is ``[script, *args]`` or ``['-m', module, *args]``.

    With a ``workdir``, each worker's output goes to its own file there, which the node echoes line by line with a
    ``[default<local rank>]:`` prefix (cloudtrain/node/worker_echo.py), so the lines of several processes never run
    into each other.
    """
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(cluster.nnodes),
            "--nproc-per-node", str(cluster.nproc_per_node), "--max-restarts", "0"]
    if workdir:
        argv += ["--redirects", "3", "--log-dir", f"{workdir}/worker-logs"]  # not --tee: see worker_echo.py
    if cluster.rdzv == "static":
        argv += ["--node-rank", str(cluster.node_rank), "--master-addr", cluster.master_addr,
                 "--master-port", str(cluster.master_port)]
    else:
        # c10d: node 0 hosts the rendezvous store; ranks follow the agents' (address, pid) order.
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.master_addr}:{cluster.master_port}",
                 "--rdzv-id", job_id, "--rdzv-conf", f"is_host={1 if cluster.node_rank == 0 else 0}"]
    if cluster.local_addr:
        argv += ["--local-addr", cluster.local_addr]
    if target[:1] == ["-m"]:
        argv += ["--module", *target[1:]]
    else:
        argv += target
    return argv
