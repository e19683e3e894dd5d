"""What a node does around torchrun, loaded by the bootstrap from the bundle's lib/ once it is unpacked: restore the
newest checkpoint before the workers start, publish a plain script's checkpoints while they run and after they end,
and copy the node's logs and outputs to the job's output location. Standard library only, Python 3.8, but for the
storage client a URI needs (imported on first use, from the image or the job's requirements). The checkpoint work
itself is cloudtrain/checkpoint's (restore.py, sync.py, parts.py): here is only when the node does it and what it says.

Each step runs in the bootstrap's own process (the plain-script sync in a thread of it), not as a Python process of
its own: a process per step paid start-up, cloudtrain's imports and the storage client's import again, on the path
between "capacity is back" and "training again" (issue 19.3/19.5). The workers learn what their node restored
(CLOUDTRAIN_RESTORED_STEP), so their Checkpointer does not list the store a second time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from cloudtrain import contract
from cloudtrain.checkpoint.files import working_files
from cloudtrain.node import events


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


def fresh_checkpoint_folder(env: dict[str, str], workdir: Path) -> Path | None:
    """A node starts with an empty checkpoint folder, as a new cloud VM does, so what it resumes from is what the
    store holds, never what an earlier run left on this machine (a local or Slurm restart reuses the node's folder).
    What was there is moved to ``<workdir>/previous-run/`` (the one before that is dropped), and the log says so.
    Returns that folder: the restore takes from it the files that match the store's manifest, instead of
    downloading them again."""
    folder = Path(env[contract.CHECKPOINT_DIR])
    kept = workdir / "previous-run" / "checkpoints"
    try:
        if not folder.is_dir() or not any(folder.iterdir()):
            return kept if kept.is_dir() else None
        if workdir.resolve() not in folder.resolve().parents:  # a folder of the user's own: never moved
            log(f"note: the checkpoint folder {folder} already holds files (a new cloud machine's would be empty); "
                "the restore puts the store's newest beside them")
            return None
        if kept.exists():
            shutil.rmtree(kept)
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(folder, kept)
    except OSError as exc:  # another file system, no permission: the restore still puts the store's newest there
        log(f"warning: the checkpoint folder {folder} holds files of an earlier run and could not be set aside "
            f"({exc}); the restore writes over them")
        return None
    log(f"checkpoint: what an earlier run left in {folder} is set aside in {kept}: this run starts from what the "
        "store holds, as a new machine would (files there that match the store's are used, not downloaded)")
    return kept


def stray_files(before: set[str], env: dict[str, str], src: Path) -> list[str]:
    """Files the script wrote into its working folder outside the checkpoint folder: a restarted node, a new
    machine, starts without them, so a checkpoint written there (the PyTorch DDP tutorial's snapshot.pt) would be
    lost without a word. Said in the log and returned for the node's status."""
    checkpoint_dir = Path(env[contract.CHECKPOINT_DIR]).resolve()
    new = [rel for rel in sorted(working_files(src) - before)
           if checkpoint_dir not in (src / rel).resolve().parents]
    if not new:
        return []
    shown = ", ".join(new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
    line = (f"the script wrote {len(new)} file(s) into its working folder ({shown}): they stay on this node (on a "
            "cloud, gone with the machine) and a restarted node starts without them; write checkpoints under "
            "checkpoint.dir (--checkpoint-dir DIR) and results under CLOUDTRAIN_OUTPUT_DIR")
    log(f"warning: {line}")
    return [line]


# what the restore had to say at the end of the node's run (a job that restored nothing it could use never reads a
# plain "succeeded"); the bootstrap's process is one node's, so this list is that node's
RESTORE_WARNINGS: list[str] = []
# what the restore brought (uri, its report, when), for the judgement after workers that failed (unloadable.py)
RESTORED: dict[str, Any] = {}


def restore_checkpoint(env: dict[str, str], cwd: Path, earlier: Path | None = None) -> str | None:
    """Bring the newest complete checkpoint into CLOUDTRAIN_CHECKPOINT_DIR before any worker starts, and tell the
    workers which step that is (``env[CLOUDTRAIN_RESTORED_STEP]``). Files of it that an earlier run left on this
    machine (``earlier``: fresh_checkpoint_folder's) are verified against the manifest and used, not downloaded.
    Returns why it could not (which stops the node), or None."""
    uri = env.get(contract.CHECKPOINT_URI)
    if not uri:
        return None
    started = time.monotonic()
    _adopt(env)
    try:
        from cloudtrain.checkpoint import restore as checkpoint_restore

        report = checkpoint_restore.restore_report(uri, _local(env, cwd), [earlier] if earlier else None,
                                                   nodes=int(env.get(contract.NNODES) or 1))
    except Exception as exc:  # a storage client that is missing or breaks: the node stops, saying why
        return f"restoring checkpoints from {uri} failed: {exc!r}"
    if report["error"]:
        return f"restoring checkpoints from {uri} failed: {report['error']}"
    step, took = report["step"], time.monotonic() - started
    RESTORED.update(uri=uri, report=report, at=time.time() - took)
    if step is not None:
        size = _folder_bytes(_local(env, cwd))
        events.emit("restored", step=step, bytes=size, seconds=round(took, 3),
                    gbps=round(size / took / 1e9, 3) if took > 0 else None)
    env[contract.RESTORED_STEP] = "none" if step is None else str(step)
    moved = f"; {report['moved']}" if report.get("moved") else ""  # one line per restore, with what it moved
    if step is None and report.get("refused"):  # the job trains from scratch: its status says so at the end
        refused = report["refused"]
        RESTORE_WARNINGS.append(f"nothing under {uri} could be restored ({len(refused)} checkpoint(s) refused: "
                                f"{refused[0]}): this run started from scratch")
    elif step is None and not report.get("passed"):
        log(f"checkpoint: none yet under {uri}")
    elif report.get("entries"):  # a snapshot of the script's own layout, back under the names it wrote
        log(f"checkpoint: restored {', '.join(map(str, report['entries']))} into {_local(env, cwd)} from "
            f"{uri} (checkpoint {step}, {took:.1f}s{moved})")
    elif step is not None:
        log(f"checkpoint: resuming from step {step} ({took:.1f}s{moved})")
    passed = report.get("passed") or []
    if passed:  # the restore said which and why; the end of the run says it again (the job's status)
        more = f" (and {len(passed) - 1} more checkpoint(s) set aside)" if len(passed) > 1 else ""
        RESTORE_WARNINGS.append(f"checkpoint {passed[0].step} under {uri} is set aside ({passed[0].reason}){more}: "
                                + (f"this run restored checkpoint {step}" if step is not None else
                                   "this run started from scratch"))
    return None


def judge_failure(env: dict[str, str], src: Path, workdir: Path, code: int,
                  masker: Any = None) -> dict[str, Any] | None:
    """Workers that failed (not preempted, not stopped) right after a restore, before any progress: the checkpoint
    they loaded is set aside, so no start restores it into the same crash again (cloudtrain/node/unloadable.py).
    Returns what the node's status records, or None; what it set aside is said at the end of the run too."""
    _adopt(env)  # the store's client (a Checkpointer of a store of its own notes what it loaded: no URI needed here)
    from cloudtrain.node import unloadable

    def mask(text: str) -> str:
        return masker(text.encode()).decode("utf-8", "replace") if masker is not None else text

    try:
        found = unloadable.judge(env, src, workdir, RESTORED, code, mask=mask, log=log)
    except Exception as exc:  # the node's outcome stands without it: said, never raised
        log(f"warning: could not judge whether the restored checkpoint is loadable ({_why(exc)})")
        return None
    if found and found.get("line"):
        RESTORE_WARNINGS.append(found["line"])
    return found


def hold_checkpoint_uri(env: dict[str, str], node_rank: int, on_lost: Any) -> Any:
    """Node 0 takes its checkpoint URI's writer lease (one live job writes to a URI: cloudtrain/checkpoint/writer.py)
    before its workers start, in a thread, while the restore runs, and renews it until the node ends. ``on_lost``:
    another job took the URI over (the node stops). None: no URI, or not node 0."""
    uri = env.get(contract.CHECKPOINT_URI)
    if not uri or node_rank != 0:
        return None
    _adopt(env)
    from cloudtrain.checkpoint import writer

    return writer.Holder(uri, writer.Identity.of(env), env.get(contract.PLATFORM, ""), log=log,
                         on_lost=on_lost).start()


def uri_refused(holder: Any) -> str | None:
    """Once node 0 has taken its URI's lease (or could not): why it may not write there (it does not start), or
    None."""
    return holder.claimed() if holder is not None else None


def let_go_of_checkpoint_uri(holder: Any, outcome: str) -> None:
    """At the node's end, before its status says so (whoever reads it may submit at once): the lease is given up
    when the job ended for good, and kept on a preemption, to expire (the job's restart takes it back, and no other
    job slips in meanwhile)."""
    if holder is not None:
        holder.finish(release=outcome != "preempted")


def _folder_bytes(folder: Path) -> int:
    """The bytes a restore put in the node's checkpoint folder (for the timeline's GB/s)."""
    total = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def start_checkpoint_sync(env: dict[str, str], cwd: Path, node_rank: int, world_size: int = 0) -> Any:
    """Node 0 publishes what a plain script writes into its checkpoint folder, while it runs; on several nodes each
    other node uploads what its ranks write there, for node 0 to publish with its own (checkpoint_parts)."""
    if not env.get(contract.CHECKPOINT_URI):
        return None
    nodes = int(env.get(contract.NNODES) or 1)
    if node_rank != 0 and nodes < 2:
        return None
    _adopt(env)
    from cloudtrain.checkpoint import parts as checkpoint_parts
    from cloudtrain.checkpoint import snapshots as checkpoint_snapshots
    from cloudtrain.checkpoint import sync as checkpoint_sync

    if node_rank == 0:
        return checkpoint_sync.PlainSync(env, cwd, world_size, nodes, log=log, announce=events.emit)
    return checkpoint_parts.PartSync(_local(env, cwd), env[contract.CHECKPOINT_URI], node_rank,
                                     checkpoint_snapshots.quiet_period(env))


def finish_checkpoint_sync(syncer: Any, env: dict[str, str], cwd: Path, succeeded: bool = True) -> str | None:
    """After the workers exited (also after SIGTERM): everything they left is final; publish it. Returns why the
    job's checkpoints are not all in the store (which fails the node), or None. What stays unpublished (a torn
    file) is said in the log and kept for the node's status (``unpublished_checkpoints``)."""
    if syncer is None:
        return None
    error = syncer.finish(succeeded=succeeded)
    for line in syncer.unpublished():
        log(f"warning: {line}")
    return error


def unpublished_checkpoints(syncer: Any) -> list[str]:
    """What the end of the node's run says of its checkpoints: a restore that found nothing it could use, files not
    published (torn, still being written), a folder the script never wrote."""
    return [*RESTORE_WARNINGS, *(syncer.unpublished() if syncer is not None else [])]


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
        from cloudtrain.node import output_upload

        runs = sum(1 for p in logs.iterdir() if p.is_dir())
        count = output_upload.upload_tree(logs, target, functools.partial(output_upload.log_name, runs=runs))
    except Exception as exc:
        warning = f"copying logs to {target} failed ({_why(exc)}); they are still in {logs} on this node"
        log(f"warning: {warning}")
        return warning
    log(f"logs: {count} file(s) copied to {target}")
    return None


def upload_outputs(env: dict[str, str], cwd: Path, node_rank: int) -> str | None:
    """Copy CLOUDTRAIN_OUTPUT_DIR to the output location (node 0 at its root, node N under node-N/), after the
    workers ended: at exit and after a preemption. Returns why it failed and where the files still are, or None: a
    job whose outputs did not reach their location has not succeeded (as with checkpoints)."""
    output, folder = env.get(contract.OUTPUT_URI), Path(env[contract.OUTPUT_DIR])
    if not output or not folder.is_dir() or not any(folder.iterdir()):
        return None
    target = output.rstrip("/") + ("" if node_rank == 0 else f"/node-{node_rank}")
    if target.startswith("file://") and Path(target[len("file://"):]).resolve() == folder.resolve():
        return None  # the folder is the output location (a mount): nothing to copy
    _adopt(env)
    try:
        from cloudtrain.node import output_upload

        count = output_upload.upload_tree(folder, target)
    except Exception as exc:
        error = f"copying outputs to {target} failed ({_why(exc)}); the files are still in {folder} on this node"
        log(f"error: {error}")
        return error
    log(f"outputs: {count} file(s) copied to {target}")
    return None
