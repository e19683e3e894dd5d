"""What a node does around torchrun, loaded by the bootstrap from the bundle's lib/ once it is unpacked: restore the
newest checkpoint before the workers start, publish a plain script's checkpoints while they run and after they end,
and copy the node's logs and outputs to the job's output location. Standard library only, Python 3.8, but for the
storage client a URI needs (imported on first use, from the image or the job's requirements).

Each step runs in the bootstrap's own process (the plain-script sync in a thread of it), not as a Python process of
its own: a process per step paid start-up, cloudtrain's imports and the storage client's import again, on the path
between "capacity is back" and "training again" (issue 19.3/19.5). The workers learn what their node restored
(CLOUDTRAIN_RESTORED_STEP), so their Checkpointer does not list the store a second time.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cloudtrain import contract


def log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def _adopt(env: dict[str, str]) -> None:
    """The node's environment becomes this process's, as it was for the processes these steps used to be: the
    storage clients read credentials and endpoints from ``os.environ``, and import from the job's PYTHONPATH (lib,
    src, the job's site-packages) ahead of the image's."""
    os.environ.update(env)
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)


def _local(env: dict[str, str], cwd: Path) -> Path:
    return cwd / env[contract.CHECKPOINT_DIR]  # a relative folder is relative to the job's source folder


def restore_checkpoint(env: dict[str, str], cwd: Path) -> str | None:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR before any worker starts, and tell the
    workers which step that is (``env[CLOUDTRAIN_RESTORED_STEP]``). Returns why it could not (which stops the node),
    or None."""
    uri = env.get(contract.CHECKPOINT_URI)
    if not uri:
        return None
    started = time.monotonic()
    _adopt(env)
    try:
        from cloudtrain import checkpoints

        report = checkpoints.restore_report(uri, _local(env, cwd))
    except Exception as exc:  # a storage client that is missing or breaks: the node stops, saying why
        return f"restoring checkpoints from {uri} failed: {exc!r}"
    if report["error"]:
        return f"restoring checkpoints from {uri} failed: {report['error']}"
    step = report["step"]
    env[contract.RESTORED_STEP] = "none" if step is None else str(step)
    log(f"checkpoint: resuming from step {step} ({time.monotonic() - started:.1f}s)" if step is not None
        else f"checkpoint: none yet under {uri}")
    return None


class PlainSync:
    """Node 0 publishes the complete ``step-<N>`` folders a plain script writes (checkpoints.sync_dir) every
    CLOUDTRAIN_CHECKPOINT_INTERVAL seconds while it runs, from a thread of the bootstrap."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        _adopt(env)
        from cloudtrain import checkpoints

        self.checkpoints = checkpoints
        self.local, self.uri = _local(env, cwd), env[contract.CHECKPOINT_URI]
        self.keep = contract.keep_count(env.get(contract.CHECKPOINT_KEEP))
        self.every = float(env.get(contract.CHECKPOINT_INTERVAL) or contract.SYNC_EVERY)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-checkpoint-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):  # the first pass after one interval, as the sync process did
            try:
                self.checkpoints.sync_dir(self.local, self.uri, final=False, keep=self.keep)
            except Exception as exc:  # the final sync tries again and decides the job's outcome
                print(f"[cloudtrain] warning: {exc}; trying again in {self.every:g}s", file=sys.stderr, flush=True)

    def finish(self) -> str | None:
        """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
        job's checkpoints are not all in the store (which fails the node), or None."""
        from cloudtrain.errors import CloudtrainError

        self._stop.set()
        self._thread.join()  # a pass under way finishes what the final one would do anyway
        try:
            self.checkpoints.sync_dir(self.local, self.uri, final=True, keep=self.keep)
        except CloudtrainError as exc:
            return str(exc)
        except Exception as exc:
            return f"the final checkpoint sync failed ({exc}); the checkpoint files are still in {self.local}"
        if (self.local / self.checkpoints.RUNTIME_MARKER).exists():
            return self.checkpoints.runtime_unpublished(self.local)
        return None


def start_checkpoint_sync(env: dict[str, str], cwd: Path, node_rank: int) -> PlainSync | None:
    """Node 0 publishes the complete step-<N> folders a plain script writes, while it runs."""
    if not env.get(contract.CHECKPOINT_URI) or node_rank != 0:
        return None
    return PlainSync(env, cwd)


def finish_checkpoint_sync(syncer: PlainSync | None, env: dict[str, str], cwd: Path) -> str | None:
    """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
    job's checkpoints are not all in the store (which fails the node), or None."""
    return None if syncer is None else syncer.finish()


def _why(exc: Exception) -> str:
    from cloudtrain.errors import CloudtrainError

    return exc.message if isinstance(exc, CloudtrainError) else str(exc)


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
    _adopt(env)
    try:
        from cloudtrain import outputs

        runs = sum(1 for p in logs.iterdir() if p.is_dir())
        count = outputs.upload_tree(logs, target, functools.partial(outputs.log_name, runs=runs))
    except Exception as exc:
        warning = f"copying logs to {target} failed ({_why(exc)}); they are still in {logs} on this node"
        log(f"warning: {warning}")
        return warning
    log(f"logs: {count} file(s) copied to {target}")
    return None


def upload_outputs(env: dict[str, str], cwd: Path, node_rank: int) -> None:
    """Copy CLOUDTRAIN_OUTPUT_DIR to the output location (node 0 at its root, node N under node-N/), after the
    workers ended: at exit and after a preemption. Best effort, like the logs."""
    output, folder = env.get(contract.OUTPUT_URI), Path(env[contract.OUTPUT_DIR])
    if not output or not folder.is_dir() or not any(folder.iterdir()):
        return
    target = output.rstrip("/") + ("" if node_rank == 0 else f"/node-{node_rank}")
    if target.startswith("file://") and Path(target[len("file://"):]).resolve() == folder.resolve():
        return  # the folder is the output location (a mount): nothing to copy
    _adopt(env)
    try:
        from cloudtrain import outputs

        count = outputs.upload_tree(folder, target)
    except Exception as exc:
        log(f"warning: copying outputs to {target} failed ({_why(exc)})")
        return
    log(f"outputs: {count} file(s) copied to {target}")
