"""What each node runs: the bootstrap command line, and the torchrun line the node will derive from it.

The torchrun line is computed by the node's own code (cloudtrain/node/launch.py, which the node runs from its bundle)
under the platform's node contract (the provider's ``node.py``, the same module the node loads from its bundle), so
what a plan shows is what a node does.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from cloudtrain import contract
from cloudtrain.job_types import NodeCommand
from cloudtrain.node import launch
from cloudtrain.node.secret_values import split_args
from cloudtrain.spec.model import JobSpec


def bootstrap_args(spec: JobSpec, *, bundle: str, digest: str, workdir: str, job_id: str, contract: str,
                   nproc: int | None, status_file: str | None = None) -> list[str]:
    """Arguments after ``python bootstrap.py``; the same for every provider. ``contract``: the node contract's path
    under the bundle's lib/ (registry). ``nproc``: processes per node as the plan resolved them (None: only the node
    knows, it starts one per GPU it has)."""
    args = ["--bundle", bundle, "--digest", digest, "--workdir", workdir, "--job-id", job_id,
            "--nproc-per-node", str(nproc) if nproc else "auto", "--node-contract", contract]
    args += ["--script", spec.script] if spec.script else ["--module", str(spec.module)]
    # secret values (a token in args, a requirement's URL with a password) travel in job_env, never on a command
    # line (ps, a platform's job description): placeholders stand for them here
    shown, _ = split_args(secret_bearing(spec), spec.env)
    script, resume, requirements = (shown[:len(spec.args)], shown[len(spec.args):len(script_args(spec))],
                                    shown[len(script_args(spec)):])
    if isinstance(spec.requirements, str):
        args += ["--requirements-file", spec.requirements]
    for req in requirements:
        args += [f"--requirement={req}"]
    if status_file:
        args += ["--status-file", status_file]
    args += [f"--resume-arg={arg}" for arg in resume]  # added by the node once it restored one
    return [*args, "--", *script]


def script_args(spec: JobSpec) -> list[str]:
    """Every argument the script may get: ``args``, then ``resume_args`` (the node adds those after a restore)."""
    return [*spec.args, *spec.resume_args]


def secret_bearing(spec: JobSpec) -> list[str]:
    """Every string of a node's command line that may hold a secret: the script's arguments, then the pip
    requirements given as a list."""
    return [*script_args(spec), *(spec.requirements if isinstance(spec.requirements, list) else [])]


def job_env(spec: JobSpec) -> dict[str, str]:
    """Variables every node of every provider sees (the user's env plus cloudtrain's own)."""
    env = dict(spec.env)
    env.update(split_args(secret_bearing(spec), spec.env)[1])  # secret arguments and requirements (bootstrap_args)
    env[contract.STRATEGY] = spec.strategy
    if spec.checkpoint.dir:  # the node makes it absolute, under the script's working folder
        env[contract.CHECKPOINT_DIR] = spec.checkpoint.dir
        env[contract.CHECKPOINT_LAYOUT] = contract.SCRIPT_LAYOUT  # every name in it is the script's own
    if spec.checkpoint.uri:
        from cloudtrain.bundle.staging import lineage_id

        env[contract.CHECKPOINT_URI] = spec.checkpoint.uri
        env.setdefault(contract.LINEAGE, lineage_id(spec))  # the spec's own env wins: continuing another job on purpose
        env[contract.CHECKPOINT_KEEP] = str(spec.checkpoint.keep)
        if spec.checkpoint.files:  # the set of files every save writes (cloudtrain/checkpoint/save_sets.py)
            env[contract.CHECKPOINT_FILES] = "\n".join(spec.checkpoint.files)
        if spec.checkpoint.take_over:  # node 0 takes the URI's writer lease from another live job (writer.py)
            env[contract.TAKE_OVER] = "1"
        if spec.checkpoint.interval:
            env[contract.CHECKPOINT_INTERVAL] = str(spec.checkpoint.interval)
    if spec.output_uri:
        env[contract.OUTPUT_URI] = spec.output_uri
    if spec.require_process_group:  # the node watch fails a run whose processes each trained alone
        env[contract.REQUIRE_PROCESS_GROUP] = "1"
    if spec.max_idle:  # the bootstrap's watchdog (cloudtrain/node/idle_watchdog.py)
        env[contract.MAX_IDLE] = str(spec.max_idle)
    for name, uri in spec.inputs.items():  # a provider that mounts or downloads inputs replaces the URI with a path
        env[input_env(name)] = uri
    return env


def checkpoint_notes(spec: JobSpec) -> list[str]:
    """What a plan says about where the script's checkpoints go, and when resume_args apply (``spec``: as the
    provider planned it, which may have given a spot job its checkpoint URI)."""
    uri, folder = spec.checkpoint.uri, spec.checkpoint.dir
    notes = []
    if folder and uri:
        notes.append(f"checkpoints: the script writes them into {folder} (${contract.CHECKPOINT_DIR}, from its "
                     f"working folder); each node restores the newest complete one from {uri} into it before the "
                     "workers start, under the names the script wrote, and node 0 publishes each complete snapshot "
                     "of it while the job runs and when it ends")
    elif folder:
        notes.append(f"checkpoint.dir {folder} is set but checkpoint.uri is not: nothing is restored into it or "
                     "published from it, so a restart starts from scratch (set --checkpoint-uri)")
    if uri and spec.checkpoint.take_over:
        notes.append(f"checkpoint.take_over: node 0 takes {uri} over from whichever job holds it, even a live one of "
                     "another lineage, which then writes no more checkpoints there (its checkpoints stay; this job "
                     "still never resumes from another lineage's); submit reads who holds it, this plan does not")
    if spec.resume_args:
        shown = " ".join(split_args(spec.resume_args, spec.env)[0])
        notes.append(f"resume_args ({shown}) are added to the script's arguments only on a node that restored a "
                     "checkpoint" if uri else f"resume_args ({shown}) are never used: without checkpoint.uri no "
                     "checkpoint is ever restored")
    return notes


def input_env(name: str) -> str:
    return f"{contract.INPUT_PREFIX}{name.upper()}"


NPROC_ON_NODE = "<one per GPU>"  # in a node line whose process count only the node can know


def node_command(rank: int, python: str, bootstrap_path: str, args: list[str], env: dict[str, str],
                 seen: dict[str, str], contract: ModuleType, job_id: str) -> NodeCommand:
    """One node's command, and the torchrun line the node derives under ``seen`` (the variables the platform
    gives that node, as its contract describes them, plus ``env``) with ``contract``. The node is sent ``env``."""
    parsed, user_args = launch.parse_args(args)
    known = parsed.nproc_per_node != "auto"
    cluster = launch.detect_cluster(contract, {**env, **seen}, parsed.nproc_per_node if known else "1")
    torchrun = launch.torchrun_argv(launch.reachable(cluster, {**env, **seen}), launch.target(parsed, user_args),
                                    job_id, python=python, workdir=parsed.workdir)
    if not known:
        torchrun[torchrun.index("--nproc-per-node") + 1] = NPROC_ON_NODE
    return NodeCommand(rank=rank, argv=[python, bootstrap_path, *args], env=env, torchrun=torchrun)


def launcher_note(provider: str, contract: ModuleType, env: dict[str, str], gpus: int) -> str | None:
    """What the bootstrap adds to the workers' environment on this platform, as the platform's own launcher would
    (EFA and NCCL settings on SageMaker), derived by the contract's own code under ``env``; the job's own env wins."""
    hook: Any = getattr(contract, "launcher_env", None)
    if hook is None:
        return None
    cluster = {"nnodes": 1, "node_rank": 0}
    added = {k: v for k, v in hook(cluster, env, gpus).items() if k not in env}
    shown = " ".join(f"{k}={v}" for k, v in added.items() if not k.startswith("SM_"))
    if not added:
        return None
    return (f"{provider}: each node's processes also get what the platform's own launcher sets: {shown}"
            + (" and its SM_* host variables" if any(k.startswith("SM_") for k in added) else ""))
