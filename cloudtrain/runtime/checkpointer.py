"""Sharded, asynchronous, preemption-aware checkpoints with torch.distributed.checkpoint.

Training is blocked only while the state is copied into host buffers allocated once and reused (pinned, on a
side CUDA stream, on a GPU: cloudtrain/runtime/stager.py); writing (DCP, several files per rank), hashing, uploading
and publishing run in a background thread, on a process group of their own (DCP on the default gloo group while
training continues hangs or crashes gloo). At most one save is in flight, so the buffers are free at the next.
On SIGTERM every rank agrees (an all_reduce on a third group) at the next ``step()``, takes a final checkpoint,
drains the upload and raises ``Preempted``. Where the node writes its checkpoint request file (a spot notice:
cloudtrain/node/spot_notice.py), the same all_reduce makes every rank save at that step, and training goes on until
the SIGTERM.

This module is the torch face of the checkpoint component: state dicts in and out, DCP, the collectives between
ranks. What files a rank uploads, the publish, retention, the markers and which step to restore are
cloudtrain/checkpoint's (saves.py and the modules it calls), which the node's own restore and sync share.

A save that cannot be written or published (the store refuses it, or stays unreachable through every retry) is
known to every rank: each raises ``CheckpointNotPublished`` at its next ``wait()`` (the next save, a stop, or
``close()``), saying where the files still are, so no rank hangs in a collective the others left. ``close()`` saves
the last step too, so a run that ends between two checkpoints leaves one to resume from.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from cloudtrain.runtime import torch_floor  # noqa: F401 - first: on an older torch, one line that says so

# isort: split
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from cloudtrain import contract, storage
from cloudtrain.checkpoint import on_demand, saves
from cloudtrain.checkpoint import restore as checkpoint_restore
from cloudtrain.checkpoint import store as checkpoint_store
from cloudtrain.checkpoint.manifest import CorruptCheckpoint
from cloudtrain.checkpoint.retention import prune_local
from cloudtrain.errors import CloudtrainError
from cloudtrain.node import events
from cloudtrain.runtime import dcp_files
from cloudtrain.runtime.data import ResumableSampler
from cloudtrain.runtime.logs import get_logger
from cloudtrain.runtime.rng import rng_state, set_rng_state
from cloudtrain.runtime.stager import REFUSED, HostStager, StagingUnavailable, fresh_copy, state_device

EXIT_PREEMPTED = contract.EXIT_PREEMPTED
_instances = itertools.count()


class CheckpointNotPublished(checkpoint_store.CheckpointNotPublished, RuntimeError):
    """A save that did not reach the store, raised on every rank; the message says where its files are. Also a
    RuntimeError, which is what a failed save raised before."""


class Preempted(SystemExit):
    """Raised on every rank once the final checkpoint is published; exits the worker with 143."""

    def __init__(self, step: int) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step = step


_crc_lock = threading.Lock()
_crc_off = 0  # saves writing now with torch.save's zip CRC turned off
_crc_before = True  # the setting they found, put back by the last one


@contextlib.contextmanager
def _without_zip_crc() -> Any:
    """torch.save (which DCP runs for each tensor) computes a zip CRC32 of every byte: 1.5 s per GB here, three
    times the write itself. Each file's sha256 in the manifest already guards every byte, so checkpoint writes
    turn it off (torch >= 2.6; ``torch.load`` reads such files). The switch is process-wide: a torch.save another
    thread runs meanwhile also writes no CRC, which torch.load does not need."""
    global _crc_off, _crc_before
    setter = getattr(torch.serialization, "set_crc32_options", None)
    getter = getattr(torch.serialization, "get_crc32_options", None)
    if setter is None or getter is None:
        yield
        return
    with _crc_lock:
        if _crc_off == 0:
            _crc_before = bool(getter())
        _crc_off += 1
        setter(False)
    try:
        yield
    finally:
        with _crc_lock:
            _crc_off -= 1
            if _crc_off == 0:
                setter(_crc_before)


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict``, on every torch the images run. torch 2.4 (Vertex's newest prebuilt container) refuses an
    optimizer that holds no state (plain SGD) while gradients are set ("state_dict can only be used if the optimizer
    states are initialized ..."), where later torch reads it as it is: the gradients are then set aside for the call
    and given back, so the training step after a save finds them as it left them (torch's refusal has already
    given zero gradients to the parameters before the first one it found set)."""
    grads = [(param, param.grad) for group in optimizer.param_groups for param in group["params"]]
    try:
        return get_state_dict(model, optimizer)
    except RuntimeError as exc:
        if "optimizer states are initialized" not in str(exc):
            raise
    try:
        for param, _ in grads:
            param.grad = None
        return get_state_dict(model, optimizer)
    finally:
        for param, grad in grads:
            param.grad = grad


class Checkpointer:
    """Create it on every rank (it makes process groups, a collective) after the model and optimizer.

    ``uri``, ``every_seconds`` and ``keep`` default to what the job spec set (CLOUDTRAIN_CHECKPOINT_*).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, scheduler: Any = None,
                 sampler: ResumableSampler | None = None, uri: str | None = None, local_dir: str | Path | None = None,
                 every_steps: int | None = None, every_seconds: float | None = None, keep: int | None = None,
                 async_save: bool = True) -> None:
        self.model, self.optimizer, self.scheduler, self.sampler = model, optimizer, scheduler, sampler
        settings = saves.Settings.resolve(uri, local_dir, every_seconds, keep)
        self.uri, self.local_dir, self.every_seconds, self.keep = \
            settings.uri, settings.local_dir, settings.every_seconds, settings.keep
        self.every_steps = every_steps
        self.async_save = async_save
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.save_group = dist.new_group(backend="gloo")
        self.control_group = dist.new_group(backend="gloo")
        self.log = get_logger("cloudtrain.checkpoint")
        if self.local_rank == 0:
            saves.claim_folder(self.local_dir)
        self.blocked_seconds: list[float] = []  # training time lost per save (staging), for benchmarks
        self._saved_at = time.monotonic()  # when the newest save stopped blocking training
        self.last_saved_step: int | None = None
        self._last_step: int | None = None  # the newest step seen by step()/save(): what close() saves
        self._stager: HostStager | None = None
        self._staging_off: str | None = None  # why reused host buffers are not used here (said once)
        self._plan_key = f"cloudtrain-checkpointer-{next(_instances)}"  # its saves' cached DCP plans
        self._inflight: threading.Thread | None = None
        self._error: CheckpointNotPublished | None = None
        self._stop_requested = False
        self._last_save = time.monotonic()
        self._restored_at: float | None = None  # when restore() loaded a checkpoint: the next step() says how long
        self._load_seconds = 0.0  # how long restore() took (on several nodes: the ranks' fetch of their shards too)
        self._previous_handler: Any = None
        self._request = saves.CheckpointRequest()  # the node's ask on a spot notice (cloudtrain/node/spot_notice.py)
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- preemption ------------------------------------------------------------------------------------
    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        self._stop_requested = True  # acted upon, on every rank together, at the next step()

    def request_stop(self) -> None:
        self._stop_requested = True

    def step(self, step: int) -> None:
        """Call after every optimizer step. Saves when due; on a stop request saves, drains and raises Preempted."""
        self._last_step = step
        if self._restored_at is not None:  # the last phase between a preemption and training again
            self.log.info(f"training again: step {step}, {time.monotonic() - self._restored_at:.1f}s after the "
                          "restore")
            if self.rank == 0:
                events.emit("training_again", step=step, after_restore_s=round(time.monotonic() - self._restored_at, 3),
                            load_s=round(self._load_seconds, 3))
            self._restored_at = None
        due_time = self.rank == 0 and self.every_seconds is not None and \
            time.monotonic() - self._last_save >= self.every_seconds
        flags = torch.tensor([int(self._stop_requested), int(due_time), int(self._request.new())])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.control_group)
        stop, due = bool(flags[0]), bool(flags[1]) or bool(self.every_steps and step % self.every_steps == 0)
        if bool(flags[2]) and not stop:  # any rank's node was asked: every rank saves this step together
            self.log.info(f"checkpoint requested by the node (a spot notice): saving step {step}")
            due = True
        if stop:
            self.log.warning(f"stop requested: final checkpoint at step {step}")
            self.save(step, block=True)
            self.close()
            raise Preempted(step)
        if due:
            self.save(step)

    # -- saving ----------------------------------------------------------------------------------------
    def _extra_state(self, step: int) -> dict[str, Any]:
        return {"step": step, "rng": rng_state(),
                "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def save(self, step: int, block: bool = False) -> None:
        self._last_step = step
        self.wait()  # at most one save in flight: the host buffers and the folder are ours again
        if step == self.last_saved_step:
            return
        folder = self.local_dir / checkpoint_store.step_dir(step)
        saves.clear_rank_files(folder, self.rank)
        extra = folder / "extra" / f"rank-{self.rank}.pt"
        extra.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        model_sd, optim_sd = _state_dicts(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        torch.save(self._extra_state(step), extra)
        # each shard goes to the store the moment DCP closes it, hashed as it was written
        upload = saves.RankUpload(folder, self.rank, self.uri, step, log=self.log.warning) if self.uri else None
        writer = dcp_files.writer(str(folder), saves.write_threads(), upload.written if upload else None,
                                  durable=saves.links_into_store(self.uri))
        write: Any
        try:
            if self.async_save:
                # the copy is whole when this returns: DCP writes it while training goes on. It is the reused host
                # buffers, else a copy for this save alone (no staging helpers, or no room for the buffers)
                write = functools.partial(dcp.save, self._stage(state), storage_writer=writer,
                                          planner=dcp_files.SavePlanner(self._plan_key),
                                          process_group=self.save_group)
            else:
                with _without_zip_crc():
                    dcp.save(state, storage_writer=writer, planner=dcp_files.SavePlanner(self._plan_key),
                             process_group=self.save_group)
                write = None
        except BaseException:
            if upload is not None:
                upload.close()  # the shards it sent are in no manifest; the next save of this step replaces them
            raise
        self.blocked_seconds.append(time.perf_counter() - started)
        self._saved_at = time.monotonic()  # the publish time in the timeline counts from here
        self._last_save = time.monotonic()
        self._inflight = threading.Thread(target=self._finish, args=(write, step, folder, upload), daemon=True,
                                          name=f"cloudtrain-checkpoint-{step}")
        self._inflight.start()
        if block:
            self.wait()

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state copied into the reused host buffers, or, where they cannot be used (said once), into new host
        memory for this save alone."""
        if self._staging_off is not None:
            return fresh_copy(state)
        try:
            if self._stager is None:
                self._stager = HostStager(state_device(state), log=self.log.warning)
            return self._stager.stage(state)
        except (StagingUnavailable, *REFUSED) as exc:
            # host memory or pinning refused, or a state torch's staging helpers do not take (an optimizer keeping
            # a value of a type they refuse): never a failed save, the slower copy instead
            self._staging_off = str(exc)
            self._stager = None
            self.log.warning(f"checkpoint staging: {exc}; each save makes a fresh host copy of the state instead "
                             "(training is blocked longer)")
            return fresh_copy(state)

    def _finish(self, write: Any, step: int, folder: Path, upload: saves.RankUpload | None) -> None:
        """Write, hash and upload this rank's files; then every rank learns whether the step was published."""
        described: list[dict[str, Any]] = []
        error = None
        try:
            if write is not None:
                with _without_zip_crc():
                    write()
            if upload is not None:
                described = upload.finish()
        except BaseException as exc:  # the others must still meet us in the collectives below
            error = f"rank {self.rank}: {saves.reason(exc)}"
        finally:
            if upload is not None:
                upload.close()
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, {"error": error, "files": described}, group=self.save_group)
        verdict: list[Any] = [[g["error"] for g in gathered if g["error"]]]
        if self.rank == 0 and self.uri and not verdict[0]:
            try:
                files = [f for g in gathered for f in g["files"]]
                remote = saves.publish_save(self.uri, step, files, self.world_size, log=self.log.warning)
                self.log.info(f"checkpoint step {step} published to {remote}")
                events.emit("checkpoint", step=step, bytes=sum(int(f.get("size") or 0) for f in files),
                            blocked_s=round(self.blocked_seconds[-1], 3) if self.blocked_seconds else None,
                            publish_s=round(time.monotonic() - self._saved_at, 3))
            except BaseException as exc:
                verdict[0] = [f"rank 0: {saves.reason(exc)}"]
        dist.broadcast_object_list(verdict, src=0, group=self.save_group)  # rank 0's publish: news to the others
        if verdict[0]:
            self._not_published(step, folder, verdict[0])
            return
        if self.rank == 0:  # the checkpoint stands; what retention misses now, the next save's retention removes
            saves.after_publish(self.local_dir, self.uri, self.keep, step, log=self.log.info, warn=self.log.warning)
        self.last_saved_step = step
        if self.local_rank == 0:  # local disk keeps the newest folder only (the bucket keeps ``keep``)
            prune_local(self.local_dir, step)
            checkpoint_store.forget_loading(self.local_dir)  # progress: what this run loaded is not in doubt

    def _not_published(self, step: int, folder: Path, errors: list[str]) -> None:
        message = saves.unpublished_message(step, self.uri, folder, errors)
        self._error = CheckpointNotPublished(message, remedy="check that the checkpoint store is writable and "
                                                     "reachable from the job")
        if self.rank == 0:
            self.log.warning(message)
            # the bootstrap's final sync reads this: the job cannot end "succeeded" with the state on a node's disk
            checkpoint_store.mark_unpublished(self.local_dir, step, message)

    def wait(self) -> None:
        """Block until the in-flight save is written, uploaded and published; raise CheckpointNotPublished (on
        every rank) if it was not."""
        if self._inflight is not None:
            self._inflight.join()
            self._inflight = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self, save: bool = True) -> None:
        """End of training, on every rank (a collective): save the last step unless it is saved already, so a run
        that ends between two checkpoints still leaves one to resume from (only where there is a store to publish
        to), wait until it is published, and give SIGTERM back to the previous handler."""
        try:
            if save and self.uri and self._last_step is not None and self._last_step != self.last_saved_step:
                self.save(self._last_step, block=True)
            self.wait()
        finally:
            if self._previous_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_handler)
                self._previous_handler = None
            if self._stager is not None:  # the host buffers: one copy of the rank's state
                self._stager.close()
                self._stager = None

    # -- restoring -------------------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest complete checkpoint (resharding if the world size changed); return its step, or 0.

        Where this node's bootstrap restored the same store into the same folder before the workers started
        (``contract.RESTORED_STEP``), the first restore of each worker loads that step: the store is not listed,
        nor anything downloaded, a second time. On several nodes the node's restore leaves the DCP shards out, and
        each rank fetches those its load reads (cloudtrain/checkpoint/on_demand.py). A file that does not match its
        manifest makes every rank fall back to the previous checkpoint, as a node's restore does."""
        started = time.monotonic()
        restored = saves.node_restored_step(self.uri, self.local_dir)
        refused: set[int] = set()
        while True:
            if self.uri and self.local_rank == 0 and restored is saves.UNKNOWN:
                checkpoint_restore.restore_latest(self.uri, self.local_dir, log=self.log.warning, nodes=self._nodes())
            dist.barrier(group=self.control_group)
            choice: list[Any] = [None]
            if self.rank == 0:
                choice[0] = saves.newest_local(self.local_dir, self.uri) if restored is saves.UNKNOWN else restored
            dist.broadcast_object_list(choice, src=0, group=self.control_group)
            if choice[0] is None:
                return 0
            step = int(choice[0])
            if step in refused:  # corrupt, and still listed: its quarantine marker could not be written
                raise CloudtrainError(f"checkpoint step {step} under {self.uri} is corrupt and could not be marked so "
                                      "in the store: not loading it again",
                                      remedy="make the checkpoint store writable from the job, or delete that "
                                             "checkpoint's manifest.json")
            if self.uri and self.local_rank == 0:  # a failure from here on, before any progress, is laid at its door
                checkpoint_store.note_loading(self.local_dir, self.uri, step)  # (cloudtrain/node/unloadable.py)
            if self._load(step):
                self._load_seconds = time.monotonic() - started  # the load ends in a collective: every rank's time
                return step
            refused.add(step)
            restored = saves.UNKNOWN  # the previous checkpoint, from the store

    def _nodes(self) -> int:
        return max(1, self.world_size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or self.world_size)))

    def _load(self, step: int) -> bool:
        """Every rank loads checkpoint ``step`` from this node's folder; False (on every rank) where a file it needs
        does not match the manifest: the checkpoint is then quarantined and its folder removed on every node."""
        folder = self.local_dir / checkpoint_store.step_dir(step)
        source = on_demand.OnDemand(self.uri, step, folder, log=self.log.warning) if self.uri else None
        own = f"extra/rank-{self.rank}.pt"
        failure: tuple[str, str] | None = None
        try:
            if source is not None:
                source.fetch([".metadata", own if source.listed(own) else "extra/rank-0.pt"])
        except CorruptCheckpoint as exc:
            failure = ("corrupt", str(exc))
        except (CloudtrainError, OSError) as exc:
            failure = ("error", saves.reason(exc))
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, failure, group=self.control_group)  # every rank: the same verdict
        errors = [(rank, v) for rank, v in enumerate(verdicts) if v is not None]
        hard = [f"rank {rank}: {why}" for rank, (kind, why) in errors if kind == "error"]
        if hard:
            raise CloudtrainError(f"restoring checkpoint step {step} from {self.uri} failed: {hard[0]}",
                                  remedy="check that the checkpoint store is reachable from the job")
        if errors:
            return self._refuse(source, step, folder, errors[0][0], errors[0][1][1])
        model_sd, optim_sd = _state_dicts(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        # its files at once; on several nodes, fetched first where this node's folder lacks them
        reader = dcp_files.ParallelFileSystemReader(str(folder), saves.write_threads(),
                                                    before_read=source.fetch if source is not None else None)
        planner = dcp_files.LoadPlanner()
        try:
            dcp.load(state, storage_reader=reader, planner=planner, process_group=self.save_group)
        except CheckpointException as exc:  # raised on every rank, before anything was read into the state
            corrupt = sorted((rank, str(failure[0])) for rank, failure in exc.failures.items()
                             if isinstance(failure[0], CorruptCheckpoint))
            if not corrupt:
                raise
            return self._refuse(source, step, folder, *corrupt[0])
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        has_own = (folder / own).is_file()  # not where the world size changed
        extra = torch.load(folder / (own if has_own else "extra/rank-0.pt"), weights_only=False)
        if has_own:
            set_rng_state(extra["rng"])
        else:
            self.log.warning(f"no RNG state for rank {self.rank} (the world size changed); RNG continues fresh")
        if self.sampler is not None and extra["sampler"] is not None:
            self.sampler.load_state_dict(extra["sampler"])
        if self.scheduler is not None and extra["scheduler"] is not None:
            self.scheduler.load_state_dict(extra["scheduler"])
        self.last_saved_step = step
        self._restored_at = time.monotonic()
        brought = f"; fetched {source.fetched_files} file(s) its load reads that this node lacked: " \
            f"{source.fetched.summary()}" if source is not None and source.fetched_files else ""
        self.log.info(f"resumed from step {step} ({folder}{brought})")
        if planner.left_out and self.rank == 0:  # the same names on every rank: said once
            shown = ", ".join(planner.left_out[:5]) + (f" and {len(planner.left_out) - 5} more"
                                                       if len(planner.left_out) > 5 else "")
            self.log.warning(f"checkpoint step {step} holds {len(planner.left_out)} entr"
                             f"{'y' if len(planner.left_out) == 1 else 'ies'} this model and optimizer have no "
                             f"place for, not loaded: {shown}; give them the layout they had at that step (a layer "
                             "thawed, a param group added) before restore(), or this run continues without them")
        return True

    def _refuse(self, source: on_demand.OnDemand | None, step: int, folder: Path, found_by: int, why: str) -> bool:
        """A file of checkpoint ``step`` that rank ``found_by`` read does not match its manifest: that rank marks
        the checkpoint corrupt in the store, and every node drops its folder, so the next choice is an older one."""
        if self.rank == found_by:
            self.log.warning(f"checkpoint step {step} is corrupt ({why}); falling back to the previous one")
            if source is not None:
                source.quarantine(why)
        dist.barrier(group=self.control_group)
        if self.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        dist.barrier(group=self.control_group)
        return False


def save_final_model(model: torch.nn.Module, uri: str | None = None, name: str = "model.pt") -> str | None:
    """Gather the full model state (a collective for FSDP) and write it from rank 0 to ``uri/name``
    (default: the job's output URI). Returns the URI written, on rank 0."""
    uri = uri or os.environ.get(contract.OUTPUT_URI)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0 or not uri:
        return None
    local = Path(os.environ.get(contract.CHECKPOINT_DIR, "/tmp")) / f".final-{name}"
    local.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, local)
    target = storage.join(uri, name)
    try:
        storage.with_retries(lambda: storage.put_file(local, target), f"upload of {target}")
    except CloudtrainError as exc:
        raise CloudtrainError(f"{exc.message}; the model is still in {local}", remedy=exc.remedy) from exc
    local.unlink(missing_ok=True)
    return target
