"""What a node does around torchrun, loaded by the bootstrap from the bundle's lib/ once it is unpacked: restore the
newest checkpoint before the workers start, publish a plain script's checkpoints while they run and after they end,
and copy the node's logs and outputs to the job's output location. Standard library only, Python 3.8 (it runs
before the job's requirements are installed); the storage clients run in the subprocesses it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cloudtrain import contract


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def _reported(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The one JSON line ``python -m cloudtrain.checkpoints`` prints last (``{}`` if it died before printing)."""
    lines = (result.stdout or "").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def restore_checkpoint(env: dict[str, str], cwd: Path) -> str | None:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR before any worker starts (in a process of
    its own: it may need a storage client). Returns why it could not (which stops the node), or None."""
    uri = env.get(contract.CHECKPOINT_URI)
    if not uri:
        return None
    cmd = [sys.executable, "-m", "cloudtrain.checkpoints", "restore", uri, env[contract.CHECKPOINT_DIR]]
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    report = _reported(result)
    if result.returncode != 0:
        why = report.get("error") or f"exit {result.returncode}"
        return f"restoring checkpoints from {uri} failed: {why}"
    step = report.get("step")
    log(f"checkpoint: resuming from step {step}" if step is not None else f"checkpoint: none yet under {uri}")
    return None


def _sync_cmd(env: dict[str, str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "cloudtrain.checkpoints", "sync", env[contract.CHECKPOINT_DIR],
            env[contract.CHECKPOINT_URI], *extra]


def start_checkpoint_sync(env: dict[str, str], cwd: Path, node_rank: int) -> subprocess.Popen[bytes] | None:
    """Node 0 publishes the complete step-<N> folders a plain script writes, while it runs."""
    if not env.get(contract.CHECKPOINT_URI) or node_rank != 0:
        return None
    every = env.get(contract.CHECKPOINT_INTERVAL) or f"{contract.SYNC_EVERY:g}"
    return subprocess.Popen(_sync_cmd(env, "--every", every), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)


def finish_checkpoint_sync(syncer: subprocess.Popen[bytes] | None, env: dict[str, str], cwd: Path) -> str | None:
    """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
    job's checkpoints are not all in the store (which fails the node), or None."""
    if syncer is None:
        return None
    syncer.terminate()
    syncer.wait()
    result = subprocess.run(_sync_cmd(env, "--final"), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True)
    if result.returncode == 0:
        return None
    error = _reported(result).get("error")
    return str(error) if error else (f"the final checkpoint sync failed (exit {result.returncode}); the checkpoint "
                                     f"files are still in {env[contract.CHECKPOINT_DIR]}")


def upload_logs(env: dict[str, str], cwd: Path, workdir: Path, node_rank: int, masker: Any = None) -> str | None:
    """Each node's worker logs go to the job's outputs (``<output>/logs/node-<rank>``), where `cloudtrain outputs`
    finds them on every platform. Best effort: a node's result never depends on it; a failure is returned as a
    warning for the status file."""
    output, logs = env.get(contract.OUTPUT_URI), workdir / "worker-logs"
    if logs.is_dir() and masker is not None:  # torchrun wrote the workers' output there, unmasked
        masker.mask_tree(logs)
    if not output or not logs.is_dir():
        return None
    target = f"{output.rstrip('/')}/logs/node-{node_rank}"
    cmd = [sys.executable, "-m", "cloudtrain.outputs", "upload-logs", str(logs), target]
    result = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    if result.returncode == 0:
        return None
    warning = f"copying logs to {target} failed (exit {result.returncode}); they are still in {logs} on this node"
    log(f"warning: {warning}")
    return warning


def upload_outputs(env: dict[str, str], cwd: Path, node_rank: int) -> None:
    """Copy CLOUDTRAIN_OUTPUT_DIR to the output location (node 0 at its root, node N under node-N/), after the
    workers ended: at exit and after a preemption. Best effort, like the logs."""
    output, folder = env.get(contract.OUTPUT_URI), Path(env[contract.OUTPUT_DIR])
    if not output or not folder.is_dir() or not any(folder.iterdir()):
        return
    target = output.rstrip("/") + ("" if node_rank == 0 else f"/node-{node_rank}")
    if target.startswith("file://") and Path(target[len("file://"):]).resolve() == folder.resolve():
        return  # the folder is the output location (a mount): nothing to copy
    result = subprocess.run([sys.executable, "-m", "cloudtrain.outputs", "upload", str(folder), target], cwd=cwd,
                            env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        log(f"warning: copying outputs to {target} failed (exit {result.returncode})")
