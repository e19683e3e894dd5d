"""What a node's bootstrap does with the job's storage around torchrun, in the bootstrap's own process: restore the
newest checkpoint before the workers start, publish the checkpoint folders a plain script writes while it runs and
once it ended, copy the node's logs and outputs to the job's output location.

The bootstrap loads this from the bundle's ``lib/`` once the bundle is unpacked (``entrypoints/bootstrap.py`` itself
stays one stdlib-only file) and calls it where it used to start ``python -m cloudtrain.checkpoints`` and
``python -m cloudtrain.outputs``: each of those was a Python process of its own (start-up, imports, the storage
client's import once more) on the path between "capacity is back" and "training again". Standard library only, but
for the storage client a URI needs (imported on first use, from the image or the job's requirements).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path

from cloudtrain import checkpoints, outputs
from cloudtrain.errors import CloudtrainError

URI_ENV, DIR_ENV = "CLOUDTRAIN_CHECKPOINT_URI", "CLOUDTRAIN_CHECKPOINT_DIR"


def _log(message: str) -> None:
    print(f"[cloudtrain] {message}", flush=True)


def _adopt(env: dict[str, str]) -> None:
    """The node's environment becomes this process's: the storage clients read credentials and endpoints from
    ``os.environ``, as the processes started with ``env`` did."""
    os.environ.update(env)


def _local(env: dict[str, str], cwd: Path) -> Path:
    return cwd / env[DIR_ENV]  # a relative folder is relative to the job's source folder, as for the workers


def restore(env: dict[str, str], cwd: Path) -> dict[str, object]:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR; ``{"step": N or None, "error": why or
    None}`` (an unreadable store, or another job's checkpoints, is an error: the node stops, saying why)."""
    _adopt(env)
    return checkpoints.restore_report(env[URI_ENV], _local(env, cwd))


class PlainSync:
    """Node 0 publishes the complete ``step-<N>`` folders a plain script writes (checkpoints.sync_dir) every
    CLOUDTRAIN_CHECKPOINT_INTERVAL seconds (60 by default) while it runs, from a thread of the bootstrap."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        _adopt(env)
        self.local, self.uri = _local(env, cwd), env[URI_ENV]
        self.keep = int(env.get("CLOUDTRAIN_CHECKPOINT_KEEP") or 2)
        self.every = float(env.get("CLOUDTRAIN_CHECKPOINT_INTERVAL") or 60)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-checkpoint-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                checkpoints.sync_dir(self.local, self.uri, final=False, keep=self.keep)
            except Exception as exc:  # the final sync tries again and decides the job's outcome
                print(f"[cloudtrain] warning: {exc}; trying again in {self.every:.0f}s", file=sys.stderr, flush=True)
            if self._stop.wait(self.every):
                return

    def finish(self) -> str | None:
        """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
        job's checkpoints are not all in the store (which fails the node), or None."""
        self._stop.set()
        self._thread.join()  # a pass under way finishes what the final one would do anyway
        try:
            checkpoints.sync_dir(self.local, self.uri, final=True, keep=self.keep)
        except CloudtrainError as exc:
            return str(exc)
        except Exception as exc:
            return f"the final checkpoint sync failed ({exc}); the checkpoint files are still in {self.local}"
        return checkpoints.runtime_unpublished(self.local) if (self.local / checkpoints.RUNTIME_MARKER).exists() \
            else None


def upload_logs(env: dict[str, str], logs: Path, uri: str) -> str | None:
    """Copy torchrun's worker logs to ``uri`` (best effort); returns a warning for the node's status, or None."""
    _adopt(env)
    runs = sum(1 for p in logs.iterdir() if p.is_dir())
    try:
        count = outputs.upload_tree(logs, uri, functools.partial(outputs.log_name, runs=runs))
    except Exception as exc:
        why = exc.message if isinstance(exc, CloudtrainError) else str(exc)
        warning = f"copying logs to {uri} failed ({why}); they are still in {logs} on this node"
        _log(f"warning: {warning}")
        return warning
    _log(f"logs: {count} file(s) copied to {uri}")
    return None


def upload_outputs(env: dict[str, str], folder: Path, uri: str) -> None:
    """Copy what a plain script left in its output folder to the job's output location (best effort)."""
    _adopt(env)
    try:
        count = outputs.upload_tree(folder, uri)
    except Exception as exc:
        _log(f"warning: copying outputs to {uri} failed ({exc})")
        return
    _log(f"outputs: {count} file(s) copied to {uri}")
