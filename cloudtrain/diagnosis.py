"""Why a node's workers failed (or did nothing), in one line a user can act on. Read by the bootstrap from the
worker logs torchrun wrote (``<workdir>/worker-logs/<run>/attempt_<n>/<local rank>/std{out,err}.log``).

The case that matters most on a laptop: a script written for GPUs (``torch.cuda.set_device``, ``backend="nccl"``)
run where there is none dies with ``module 'torch._C' has no attribute '_cuda_setDevice'``, or prints that it
found no GPUs and exits 0. Standard library only: nodes run it before anything is installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cloudtrain import rank_report

GPU_FIX = ("run it on a GPU provider (e.g. --provider aws --gpus A10G:1), or let the script pick its backend and "
           "device from the environment: cloudtrain.runtime.init_distributed()")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
_GPU_WORDS = re.compile(r"cuda|nccl|\bgpus?\b", re.IGNORECASE)
_TAIL_BYTES = 64 * 1024


def newest_run(worker_logs: Path) -> Path | None:
    """The folder of the newest torchrun run under ``--log-dir`` (a restarted node holds one per run)."""
    runs = [p for p in worker_logs.iterdir() if p.is_dir()] if worker_logs.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def _tail(path: Path) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def rank_logs(run: Path | None) -> dict[str, dict[str, list[str]]]:
    """{local rank: {"stdout": lines, "stderr": lines}} for the newest attempt of ``run``."""
    if run is None:
        return {}
    attempts = sorted(run.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]) if p.name[8:].isdigit() else 0)
    if not attempts:
        return {}
    ranks = sorted((p for p in attempts[-1].iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return {p.name: {kind: _tail(p / f"{kind}.log") for kind in ("stdout", "stderr")} for p in ranks}


def last_exception(lines: list[str]) -> str | None:
    """The last ``SomeError: message`` line of a traceback, or None."""
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION.match(text) and ":" in text:
            return text
    return None


def explain_failure(run: Path | None, gpus: int) -> str | None:
    """One line for a node whose workers failed: the first rank's exception, and on a node without GPUs, when that
    exception is about CUDA or NCCL, that the script needs a GPU and what to do instead."""
    for local_rank, logs in rank_logs(run).items():
        error = last_exception(logs["stderr"])
        if error is None:
            continue
        if gpus == 0 and _GPU_WORDS.search(error):
            return f"local rank {local_rank} needs a GPU and this machine has none ({error}): {GPU_FIX}"
        return f"local rank {local_rank}: {error}"
    return None


def explain_idle_gpu_script(run: Path | None, gpus: int) -> str | None:
    """For workers that exited without joining a process group on a node without GPUs: the line where a script
    said it wanted GPUs (e.g. 'Unable to locate sufficient 2 gpus'), and the fix. None if no worker said so."""
    if gpus:
        return None
    for local_rank, logs in rank_logs(run).items():
        for line in logs["stdout"] + logs["stderr"]:
            if _GPU_WORDS.search(line):
                return f"local rank {local_rank} printed {line.strip()[:200]!r} and this machine has no GPU: {GPU_FIX}"
    return None


def findings(workdir: Path, outcome: str, gpus: int) -> dict[str, Any]:
    """What a node's status file adds once its workers exited: ``ranks`` (their reports: did they join a process
    group), ``reason`` (why a failed node failed, when its logs say), ``note`` (a run that "succeeded" with each
    process alone) and ``hint`` (for such a run on a machine without GPUs: what the script was looking for)."""
    found: dict[str, Any] = {}
    ranks = rank_report.summarize(workdir / "ranks")
    run = newest_run(workdir / "worker-logs")
    if ranks:
        found["ranks"] = ranks
    if outcome == "failed":
        reason = explain_failure(run, gpus)
        if reason:
            found["reason"] = reason
    elif outcome == "succeeded" and ranks:
        alone = rank_report.alone_text(ranks)
        hint = explain_idle_gpu_script(run, gpus) if alone else None
        found.update({"note": alone} if alone else {}, **({"hint": hint} if hint else {}))
    return found
