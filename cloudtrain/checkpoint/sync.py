"""The plain-script sync: what a script writes into its checkpoint folder is published while it runs and after it
ends, by the node (cloudtrain/node/steps.py starts it, in a thread of the bootstrap's process), for scripts that do
not use the Checkpointer (stdlib only).

cloudtrain's own ``step-<N>`` folders are published one by one (``sync_dir``): a folder is complete once a newer one
exists, or at exit. Any other layout is published as snapshots (snapshots.py); on several nodes the other nodes'
files reach node 0 through the store (parts.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import contract, storage
from cloudtrain.checkpoint import save_sets
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.download import log_line
from cloudtrain.checkpoint.files import broken, marker_missing, working_files
from cloudtrain.checkpoint.manifest import MANIFEST, step_dir, step_of
from cloudtrain.checkpoint.parts import NodeParts, within
from cloudtrain.checkpoint.retention import apply_retention
from cloudtrain.checkpoint.snapshots import Snapshotter, quiet_period
from cloudtrain.errors import CloudtrainError

if TYPE_CHECKING:  # only in annotations: nodes may run Python 3.8, where collections.abc types take no [...]
    Log = Callable[[str], None]
    Judge = Callable[[Path, bool], "tuple[str | None, list[tuple[Path | str, list[dict[str, Any]]]]]"]

_print = log_line
EMPTY_AFTER = 120.0  # seconds before an empty checkpoint folder is said (at most; sooner with a shorter interval)
EMPTY_EVENT = "checkpoint_dir_empty"  # the timeline's word for it (`status` and `preempt` say it again)


def sync_dir(local_root: Path, uri: str, *, final: bool, keep: int = contract.MIN_KEEP,
             log: Log = _print, judge: Judge | None = None) -> list[int]:
    """Publish the ``step-<N>`` folders a plain script wrote into CLOUDTRAIN_CHECKPOINT_DIR.

    A folder is complete once a newer one exists, or at exit (``final``). A directory the runtime Checkpointer
    writes (``RUNTIME_MARKER``) publishes itself and is skipped whole; restored or already published folders carry
    a manifest and are skipped. Like SageMaker's /opt/ml/checkpoints, but complete folders only, and local deletes
    are never mirrored to the bucket. Returns the steps published; raises CheckpointNotPublished (saying which
    steps and where their files are) when a folder could not be published. ``judge(folder, final)`` (the node's
    sync): why a folder is no checkpoint (yet), or None and the files other nodes wrote into it, as
    ``(their folder, their descriptions)`` pairs (a folder here, or one in the store that the store copies from);
    a folder it turns down stays unpublished.
    """
    if (local_root / checkpoint_store.RUNTIME_MARKER).exists():
        return []
    found = sorted((step, p) for p in local_root.glob("step-*")
                   if p.is_dir() and (step := step_of(p.name, canonical=False)) is not None)
    ready = [(step, folder) for step, folder in (found if final else found[:-1])
             if not (folder / MANIFEST).exists()]  # restored, or published already (a dcp.save folder is welcome)
    published = []
    for step, folder in ready:
        why, others = judge(folder, final) if judge is not None else (None, [])
        if why is not None:
            continue
        try:
            rel = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            files = checkpoint_store.describe_files(folder, rel)
            remote = storage.join(uri, step_dir(step))
            checkpoint_store.upload_files(folder, files, remote, log=log)
            for root, theirs in others:  # a name this node holds too is this node's file
                theirs = [f for f in theirs if f["path"] not in {mine["path"] for mine in files}]
                checkpoint_store.carry_files(root, theirs, remote, log=log)
                files += theirs
            checkpoint_store.publish(remote, step, files, world_size=0, kind="files", log=log)
        except (CloudtrainError, OSError) as exc:
            left = [f.name for s, f in ready if s not in published]
            why = exc.message if isinstance(exc, CloudtrainError) else str(exc)
            raise checkpoint_store.CheckpointNotPublished(
                f"checkpoint folder(s) {left} not published to {uri}: {why}; the files are still in {local_root}",
                remedy="check that the checkpoint store is writable and reachable from the job") from exc
        try:  # this node's note that the folder is published: a disk the checkpoints filled may refuse it
            (folder / MANIFEST).write_text(json.dumps({"step": step, "published": remote}))
        except OSError as exc:  # the checkpoint stands in the store; without the note a later pass publishes it again
            log(f"warning: published {remote}, but cannot note it in {folder} ({exc.strerror or exc}): free space "
                f"on the disk holding {local_root}, or keep fewer checkpoints (checkpoint.keep)")
        published.append(step)
    if published:
        log(f"published plain-script checkpoint(s) {published} to {uri}")
        try:  # the checkpoints stand; what retention misses now, the next publish's retention removes
            apply_retention(uri, keep, log=log)
        except (CloudtrainError, OSError) as exc:
            log(f"retention under {uri} failed ({exc}); the next publish tries again")
    return published


class PlainSync:
    """Node 0 publishes what a plain script writes into its checkpoint folder while it runs, from a thread of the
    bootstrap: cloudtrain's own ``step-<N>`` folders one by one (sync_dir, every
    CLOUDTRAIN_CHECKPOINT_INTERVAL seconds) and any other layout as snapshots (snapshots.py, looked at every
    second: taking one needs two looks a quiet period apart)."""

    LOOK_EVERY = 1.0

    def __init__(self, env: dict[str, str], cwd: Path, world_size: int = 0, nodes: int = 1,
                 log: Log = log_line, announce: Callable[..., None] | None = None) -> None:
        self.log = log
        # a relative folder is relative to the job's source folder
        self.local, self.uri = cwd / env[contract.CHECKPOINT_DIR], env[contract.CHECKPOINT_URI]
        self.world_size = world_size
        # on several nodes, the files the other nodes' ranks write into a folder entry reach it through the store
        self.parts = NodeParts(self.uri, nodes, self.local.parent / f".{self.local.name}.parts") \
            if nodes > 1 else None
        self.left: dict[str, str] = {}  # step-<N> folders not published at the end, with why
        self.folder_parts: dict[str, list[Any]] = {}  # step-<N> folder -> the other nodes' parts it was judged with
        self.keep = contract.keep_count(env.get(contract.CHECKPOINT_KEEP))
        self.every = float(env.get(contract.CHECKPOINT_INTERVAL) or contract.SYNC_EVERY)
        # the script's own folder (checkpoint.dir): every entry is its own, step-<N> folders too; else cloudtrain's
        # step-<N> folders are published one by one (sync_dir) and only the other entries as snapshots
        self.own_layout = env.get(contract.CHECKPOINT_LAYOUT) == contract.SCRIPT_LAYOUT
        self.snapshots = Snapshotter(
            self.local, self.uri, self.keep, quiet_period(env), world_size=world_size,
            step_folders=self.own_layout, parts=self.parts,
            files=save_sets.parse_declared(env.get(contract.CHECKPOINT_FILES)), announce=announce)
        self.cwd, self.before = cwd, working_files(cwd)  # to tell a folder the script never writes (a typo)
        self.announce = announce
        # the first look at an empty folder: after the first minutes at most (an interval can be hours long)
        self.empty_look, self.empty_said = time.monotonic() + min(self.every, EMPTY_AFTER), False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-checkpoint-sync", daemon=True)
        self._thread.start()

    def _pass(self, final: bool, succeeded: bool = True) -> None:
        if (self.local / checkpoint_store.RUNTIME_MARKER).exists():
            return  # the Checkpointer publishes its own folders
        if not self.own_layout:
            self._sync_step_folders(final)
        self.snapshots.poll(final=final, succeeded=succeeded)

    def _sync_step_folders(self, final: bool) -> None:
        published = sync_dir(self.local, self.uri, final=final, keep=self.keep, judge=self._judge)
        if self.parts is not None:
            for name in [n for n in self.folder_parts if step_of(n, False) in published]:
                self.parts.taken(self.folder_parts.pop(name))

    def _judge(self, folder: Path, final: bool) -> tuple[str | None, list[tuple[Path | str, list[dict[str, Any]]]]]:
        """Whether a ``step-<N>`` folder is a checkpoint: none of its files torn or empty, every node's files of it
        in the store (with DCP, a shard of every rank). Returns why not (said once; kept at the end), or None and
        the other nodes' files of it (their folder, their descriptions relative to it)."""
        name = folder.name
        rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        why, parts = broken(folder, rels), []
        if why is None and self.parts is not None:  # every node's files of it, DCP shards counted over all
            found, problems = self.parts.complete([name], [f"{name}/{rel}" for rel in rels], final, self.world_size)
            why, parts = problems.get(name), found[name]
        elif why is None:
            missing = marker_missing(name, [f"{name}/{rel}" for rel in rels], self.world_size)
            why = f"no node holds its {missing}" if missing else None
        if why is not None:
            if final:
                self.left[name] = why
            return why, []
        self.folder_parts[name] = parts
        cut = len(name) + 1
        return None, [(within(part, name), [{**f, "path": f["path"][cut:]} for f in part.files]) for part in parts]

    def _run(self) -> None:
        next_sync = time.monotonic() + self.every  # step folders: the first pass after one interval, as before
        while not self._stop.wait(min(self.every, self.LOOK_EVERY)):
            try:
                if not self.own_layout and time.monotonic() >= next_sync:
                    next_sync = time.monotonic() + self.every
                    self._sync_step_folders(final=False)
                if not (self.local / checkpoint_store.RUNTIME_MARKER).exists():
                    self.snapshots.poll()
                self._empty_while_running()
            except Exception as exc:  # the final sync tries again and decides the job's outcome
                log_line(f"warning: {exc}; trying again")

    def _holds_nothing(self) -> bool:
        try:
            return not any(not name.startswith(".") for name in os.listdir(self.local))
        except OSError:
            return True

    def _empty_while_running(self) -> None:
        """Said once, after the first minutes (EMPTY_AFTER) or one interval if shorter: the checkpoint folder is
        still empty while the script writes files elsewhere under its working folder (``--checkpoint-dir ckpts``
        for a script that saves into ``ckpt``). An event too, so that `status` and `preempt` repeat it."""
        if self.empty_said or time.monotonic() < self.empty_look or not self._holds_nothing():
            return
        # the working folder is walked once per look, no more often
        self.empty_look = time.monotonic() + min(self.every, EMPTY_AFTER)
        elsewhere = sorted(working_files(self.cwd) - self.before)
        if elsewhere:
            self.empty_said = True
            line = self._empty_line(elsewhere)
            self.log(f"warning: {line}")
            if self.announce is not None:
                self.announce(EMPTY_EVENT, text=line)

    def _empty_line(self, elsewhere: list[str]) -> str:
        if not elsewhere:  # no sign of a folder mixed up (a script that failed early, or never saves): the fact
            return f"the checkpoint folder {self.local} stayed empty: nothing was published to the checkpoint store"
        shown = ", ".join(elsewhere[:3]) + (f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else "")
        return (f"the checkpoint folder {self.local} is empty while the script wrote {shown}: nothing is published "
                "to the checkpoint store; is checkpoint.dir (--checkpoint-dir) the folder the script saves into?")

    def finish(self, succeeded: bool = True) -> str | None:
        """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
        job's checkpoints are not all in the store (which fails the node), or None. ``succeeded``: the workers ended
        on their own, each with 0 (not stopped, not failed), so no save of theirs was cut short."""
        self._stop.set()
        self._thread.join()  # a pass under way finishes what the final one would do anyway
        try:
            self._pass(final=True, succeeded=succeeded)
        except CloudtrainError as exc:
            return str(exc)
        except Exception as exc:
            return f"the final checkpoint sync failed ({exc}); the checkpoint files are still in {self.local}"
        finally:
            if self.parts is not None:
                self.parts.close()
        if (self.local / checkpoint_store.RUNTIME_MARKER).exists():
            return checkpoint_store.runtime_unpublished(self.local)
        return None

    def unpublished(self) -> list[str]:
        """After ``finish``: what the checkpoint folder holds that is not in the store (torn, or still being written
        when the workers ended), each with why."""
        lines = [f"not published (it stays on this node only): {line}" for line in
                 [*(f"{self.local / name} ({why})" for name, why in sorted(self.left.items())),
                  *self.snapshots.unpublished]]
        if self._holds_nothing() and not self.snapshots.published:  # the end of every job says it, not only a stop
            lines.append(self._empty_line(sorted(working_files(self.cwd) - self.before)))
        return lines
