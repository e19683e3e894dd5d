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

from cloudtrain import contract, safe_json
from cloudtrain.node import rank_report

GPU_FIX = ("run it on a GPU provider (e.g. --provider aws --gpus A10G:1), or let the script pick its backend and "
           "device from the environment: cloudtrain.runtime.init_distributed()")
# torch 2.4 and 2.5 (the default images' torch) run FSDP2 on CUDA only: the script is right, the local torch is old.
# 2.5 says so; 2.4 fails in torch.cuda.Stream, seen as a frame of torch's FSDP in the rank's traceback
FSDP_CUDA_ONLY = "FSDP requires CUDA for streams"
_FSDP_FRAME = re.compile(r'File "[^"]*/torch/distributed/(?:_composable/)?fsdp/')
FSDP_FIX = ("this torch's FSDP runs on CUDA only: run it on a GPU provider (e.g. --provider aws --gpus A10G:1), or "
            "rehearse it here with a newer torch, whose FSDP also runs on CPU with gloo (torch 2.13 does)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
_GPU_WORDS = re.compile(r"cuda|nccl|\bgpus?\b", re.IGNORECASE)
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch prefixes a worker's traceback once it joined a process group
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = {"The above exception was the direct cause of the following exception:": "caused by",
            "During handling of the above exception, another exception occurred:": "raised while handling"}
# What a rank raises when another rank died first: named only when no rank says more.
_PEER_GONE = re.compile(r"closed by peer|reset by peer|broken pipe|remote worker crash|communicator was aborted",
                        re.IGNORECASE)
# torchrun's own failures (its rendezvous, its arguments), kept beside the worker logs by launcher_stderr.LauncherStderr
LAUNCHER_LOG = "torchrun.log"
# what torchrun raises for a failed worker (the worker's own logs say more), and for a stop it was sent (a traceback
# an earlier run in the same folder left, when this one's torchrun died without one)
_NOT_THE_LAUNCHERS = ("ChildFailedError", "SignalException")
# c10d's TCPStore when its port is taken: torchrun's store (or, with older torch, rank 0's) could not listen
_STORE_PORT_TAKEN = re.compile(r"socket has failed to listen.*\bport: (\d+).*EADDRINUSE", re.IGNORECASE)
# A status file's "cause" for a rendezvous port another process took: the local supervisor, which chose the port,
# starts the nodes again on another one.
PORT_IN_USE = "rendezvous-port-in-use"
_TAIL_BYTES = 64 * 1024
_MAX_ERROR = 600  # characters of an exception line kept in a one-line reason (a path and a cause fit)


def newest_run(worker_logs: Path) -> Path | None:
    """The folder of the newest torchrun run under ``--log-dir`` (a restarted node holds one per run)."""
    runs = [p for p in worker_logs.iterdir() if p.is_dir()] if worker_logs.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def _tail(path: Path) -> list[str]:
    """The last lines of a worker's log, without the ``[rankN]: `` prefix torch gives its traceback."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
            return [_RANK_PREFIX.sub("", line) for line in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return []


def _rank_dirs(run: Path | None) -> list[Path]:
    """The local ranks' folders of the newest attempt of ``run``, in rank order."""
    if run is None:
        return []
    attempts = sorted(run.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]) if p.name[8:].isdigit() else 0)
    if not attempts:
        return []
    return sorted((p for p in attempts[-1].iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def rank_folders(run: Path | None) -> list[Path]:
    """The local ranks' folders of the newest attempt of ``run`` (each holds its stdout.log and stderr.log)."""
    return _rank_dirs(run)


def rank_logs(run: Path | None) -> dict[str, dict[str, list[str]]]:
    """{local rank: {"stdout": lines, "stderr": lines}} for the newest attempt of ``run``."""
    return {p.name: {kind: _tail(p / f"{kind}.log") for kind in ("stdout", "stderr")} for p in _rank_dirs(run)}


def _raised(lines: list[str], start: int) -> str | None:
    """The exception line that ends the traceback starting at ``lines[start]``: the first unindented line after
    its frames (``AssertionError`` alone included)."""
    for line in lines[start + 1:]:
        if line.strip() and not line[0].isspace():
            return clip(line.strip())
    return None


def clip(text: str) -> str:
    """At most _MAX_ERROR characters of an exception line, its head and its tail: what went wrong comes first,
    where the files are and how to fix it often last (CheckpointNotPublished: '...; its files are still in DIR')."""
    if len(text) <= _MAX_ERROR:
        return text
    half = (_MAX_ERROR - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def last_exception(lines: list[str]) -> str | None:
    """The exception the last traceback in ``lines`` ended in, with the one it came from when Python printed a
    chain (``raise ... from``, or an error while handling another); without a traceback, the last line that reads
    like ``SomeError: message`` (a script that printed its error and exited)."""
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK and not line[0].isspace()]
    error = _raised(lines, starts[-1]) if starts else None
    if error:
        before = [line.strip() for line in lines[:starts[-1]] if line.strip()]
        link = _CHAINED.get(before[-1]) if before and len(starts) > 1 else None
        first = _raised(lines, starts[-2]) if link else None
        return f"{error} ({link} {first})" if first else error
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION.match(text) and ":" in text:
            return clip(text)
    return None


def _error_file(path: Path) -> str | None:
    """The exception a worker recorded in its torch.distributed.elastic error file (torchrun names one in each
    worker's TORCHELASTIC_ERROR_FILE; a script whose main is wrapped in ``@record`` writes it when it raises)."""
    try:
        data = safe_json.load(path)
        message = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(message, dict):
        stack = message.get("extraInfo", {}).get("py_callstack")
        found = last_exception(stack.splitlines()) if isinstance(stack, str) else None
        message = found or message.get("message")
    return clip(str(message).strip()) if message else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")


def first_failure(run: Path | None) -> tuple[str, str] | None:
    """(local rank, exception) of the rank that failed first: from its error file, else its stderr; a rank whose
    peer went away (connection closed ...) only when no other rank raised. Ranks that raised the same exception
    (each one alone, as a GPU-only script does on a CPU) are named by the lowest, whichever wrote last."""
    found = []
    for folder in _rank_dirs(run):
        error, written = _error_file(folder / "error.json"), _mtime(folder / "error.json")
        if error is None:
            error, written = last_exception(_tail(folder / "stderr.log")), _mtime(folder / "stderr.log")
        if error:
            found.append((bool(_PEER_GONE.search(error)), written, int(folder.name), error))
    if not found:
        return None
    error = min(found)[3]
    return str(min(rank for _, _, rank, same in found if same == error)), error


def _in_fsdp(run: Path | None, local_rank: str) -> bool:
    """Whether the rank's traceback passes through torch's FSDP."""
    return any(_FSDP_FRAME.search(line) for folder in _rank_dirs(run) if folder.name == local_rank
               for line in _tail(folder / "stderr.log"))


def explain_failure(run: Path | None, gpus: int) -> str | None:
    """One line for a node whose workers failed: the first failed rank's exception, and on a node without GPUs, when
    that exception is about CUDA or NCCL, that the script needs a GPU and what to do instead."""
    first = first_failure(run)
    if first is None:
        return None
    local_rank, error = first
    if gpus == 0 and _GPU_WORDS.search(error):
        fix = FSDP_FIX if FSDP_CUDA_ONLY in error or _in_fsdp(run, local_rank) else GPU_FIX
        return f"local rank {local_rank} needs a GPU and this machine has none ({error}): {fix}"
    return f"local rank {local_rank}: {error}"


def explain_launcher(worker_logs: Path) -> str | None:
    """One line for a node whose torchrun failed with no worker to blame: the exception torchrun itself ended in
    (a rendezvous that could not start or be reached, a bad argument), read from its stderr kept in LAUNCHER_LOG.
    A port another process holds says so, which port, and what to do."""
    error = last_exception(_tail(worker_logs / LAUNCHER_LOG))
    if error is None or any(word in error for word in _NOT_THE_LAUNCHERS):
        return None
    taken = _STORE_PORT_TAKEN.search(error)
    if taken:
        return (f"torchrun could not start the rendezvous: port {taken.group(1)} on this node is held by another "
                f"process (EADDRINUSE: a process of an earlier run still alive, or another job on this host): stop "
                f"it, or give the job another port ({error})")
    return f"torchrun failed before its workers did: {error}"


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


def explain_alone(run: Path | None, gpus: int, ranks: dict[str, Any], env: dict[str, str]) -> str:
    """What to do about processes that each trained alone: the framework's own fix where the rank reports say the
    workers imported one, else what a script that looked for GPUs printed (on a node without), else what a plain
    script must call. ``env``: the workers' environment."""
    frameworks, ran, world = ranks.get("frameworks") or [], ranks.get("ran") or 1, ranks.get("world_size") or 1
    if "lightning" in frameworks or "pytorch_lightning" in frameworks:
        return (f"PyTorch Lightning ran each process on its own: a Trainer with devices=1 (the default without GPUs) "
                f"starts one process; under torchrun give it Trainer(devices={ran}, num_nodes={max(1, world // ran)})")
    if "accelerate" in frameworks and not gpus and env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return ("Accelerate ran each process on its own although ACCELERATE_USE_CPU is set: only Accelerator() reads "
                "it; a script that creates PartialState() itself must pass PartialState(cpu=True)")
    if "accelerate" in frameworks and not gpus:
        return ("Accelerate runs each process on its own on a machine without GPUs unless told to use the CPU: "
                "submit with --env ACCELERATE_USE_CPU=1")
    gpu_script = explain_idle_gpu_script(run, gpus)
    if gpu_script:
        return gpu_script
    if ranks.get("silent"):
        return ("nothing ran over the group: wrap the model in DistributedDataParallel (or cloudtrain.runtime."
                "wrap_model), or check that the framework was set up for this many processes")
    return ("the script never joined the job's process group: call torch.distributed.init_process_group() (or "
            "cloudtrain.runtime.init_distributed()) in every process, and wrap the model in DistributedDataParallel")


def findings(workdir: Path, outcome: str, gpus: int, env: dict[str, str]) -> dict[str, Any]:
    """What a node's status file adds once its workers exited: ``ranks`` (their reports: did they join a process
    group), ``reason`` (why a failed node failed, when its logs say), ``note`` (a run that "succeeded" with each
    process alone) and ``hint`` (what to do about such a run). With require_process_group (in the node's ``env``)
    such a run failed instead (``outcome``), the note and hint its ``reason``."""
    found: dict[str, Any] = {}
    required = env.get(contract.REQUIRE_PROCESS_GROUP) == "1"
    ranks = rank_report.summarize(workdir / "ranks")
    run = newest_run(workdir / "worker-logs")
    if ranks:
        found["ranks"] = ranks
    if outcome == "failed":
        reason = explain_failure(run, gpus) or explain_launcher(workdir / "worker-logs")
        if reason:
            found["reason"] = reason
        if reason and _STORE_PORT_TAKEN.search(reason):
            found["cause"] = PORT_IN_USE
    elif outcome == "succeeded" and ranks:
        alone = rank_report.alone_text(ranks)
        if alone and required:
            found.update(outcome="failed", reason=f"{alone}, and require_process_group is set: "
                                                  f"{explain_alone(run, gpus, ranks, env)}")
        elif alone:
            found.update(note=alone, hint=f"{explain_alone(run, gpus, ranks, env)} (--require-process-group makes such "
                                          "a run fail)")
    return found
