"""What each node runs: the bootstrap command line, and the torchrun line the bootstrap will derive from it.

The torchrun line is computed by the bootstrap's own code (loaded from ``entrypoints/bootstrap.py``), so what a
plan shows is what a node does.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from types import ModuleType

from cloudtrain.home import resource_dir
from cloudtrain.plan import NodeCommand
from cloudtrain.spec import JobSpec


@cache
def bootstrap_module() -> ModuleType:
    path = resource_dir("entrypoints") / "bootstrap.py"
    spec = importlib.util.spec_from_file_location("cloudtrain_bootstrap", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cloudtrain_bootstrap", module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def bootstrap_args(spec: JobSpec, *, bundle: str, digest: str, workdir: str, job_id: str,
                   status_file: str | None = None, nproc: str | None = None) -> list[str]:
    """Arguments after ``python bootstrap.py``; the same for every provider. ``nproc='auto'`` lets each node
    count its own GPUs (1 without any), which is what a local machine needs."""
    args = ["--bundle", bundle, "--digest", digest, "--workdir", workdir, "--job-id", job_id,
            "--nproc-per-node", nproc or str(spec.nproc_per_node)]
    args += ["--script", spec.script] if spec.script else ["--module", str(spec.module)]
    if isinstance(spec.requirements, str):
        args += ["--requirements-file", spec.requirements]
    elif spec.requirements:
        for req in spec.requirements:
            args += ["--requirement", req]
    if status_file:
        args += ["--status-file", status_file]
    return [*args, "--", *spec.args]


def job_env(spec: JobSpec) -> dict[str, str]:
    """Variables every node of every provider sees (the user's env plus cloudtrain's own)."""
    env = dict(spec.env)
    env["CLOUDTRAIN_STRATEGY"] = spec.strategy
    if spec.checkpoint.uri:
        env["CLOUDTRAIN_CHECKPOINT_URI"] = spec.checkpoint.uri
        env["CLOUDTRAIN_CHECKPOINT_KEEP"] = str(spec.checkpoint.keep)
        if spec.checkpoint.interval:
            env["CLOUDTRAIN_CHECKPOINT_INTERVAL"] = str(spec.checkpoint.interval)
    if spec.output_uri:
        env["CLOUDTRAIN_OUTPUT_URI"] = spec.output_uri
    if spec.max_idle:  # the bootstrap's watchdog (cloudtrain/watchdog.py)
        env["CLOUDTRAIN_MAX_IDLE"] = str(spec.max_idle)
    for name, uri in spec.inputs.items():  # a provider that mounts or downloads inputs replaces the URI with a path
        env[input_env(name)] = uri
    return env


def input_env(name: str) -> str:
    return f"CLOUDTRAIN_INPUT_{name.upper()}"


def node_command(rank: int, python: str, bootstrap_path: str, args: list[str], env: dict[str, str],
                 job_id: str) -> NodeCommand:
    """Build one node's command and derive its torchrun line under the given environment."""
    boot = bootstrap_module()
    parsed, user_args = boot.parse_args(args)
    cluster = boot.detect_cluster(env, parsed.nproc_per_node)
    target = [parsed.script, *user_args] if parsed.script else ["-m", parsed.module, *user_args]
    torchrun = boot.torchrun_argv(boot.reachable(cluster, env), target, job_id, python=python, workdir=parsed.workdir)
    return NodeCommand(rank=rank, argv=[python, bootstrap_path, *args], env=env, torchrun=torchrun)
