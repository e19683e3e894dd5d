"""What the CLI and the SDK do with a job already submitted, by its handle: its status with the point a restart
resumes from, its logs, a rehearsed preemption, its cost. Kept apart from ``cloudtrain.sdk`` so that `cloudtrain
status|logs|wait|preempt|cost`, a short process each (and a loop's poll), load neither the spec's models nor
packaging."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobStatus
from cloudtrain.providers.base import Provider


def with_restart_point(status: JobStatus) -> JobStatus:
    """A job that may restart (running, stopping, preempted) says what a restart starts from: the newest checkpoint
    its store holds, or "from scratch" (read from the store here; said nothing where this machine cannot read it).
    What `cloudtrain status|wait|preempt` and ``Run.status()`` show."""
    from cloudtrain.errors import CloudtrainError

    if (note := budget_note(status.handle)) and note not in status.message:  # the budget watcher stopped it
        status.message = f"{status.message}; {note}" if status.message else note
    if not status.checkpoint_uri or status.state.value in ("succeeded", "failed", "cancelled"):
        return status
    try:
        from cloudtrain.checkpoint import set_aside
        from cloudtrain.checkpoint import store as checkpoint_store
        from cloudtrain.checkpoint.restore import resume_point

        status.restart_resumes = resume_point(status.checkpoint_uri)
        passed = set_aside.newest_note(checkpoint_store.survey(status.checkpoint_uri, log=lambda _line: None))
        if passed:  # why not a newer one: `cloudtrain checkpoints` lists them all
            status.restart_resumes += f"; {passed}"
    except (CloudtrainError, OSError, ImportError, ValueError):
        pass
    return status


def restore_from(uri: str | None, step: int, lineage: str | None, log: Any) -> dict[str, Any]:
    """``submit --restore-from N`` (``Job.submit(restore_from=N)``), before the job is sent: checkpoint N under the
    job's store becomes the one it restores (cloudtrain/checkpoint/restore_from.py). Refused with exit 2 where the
    job has no store, the store has no such checkpoint, or cannot be read from here."""
    from cloudtrain.checkpoint.restore_from import FLAG, choose
    from cloudtrain.errors import CloudtrainError, UserError

    if not uri:
        raise UserError(f"{FLAG} {step}: the job has no checkpoint store to restore from", field=FLAG,
                        remedy="give it one: --checkpoint-uri (checkpoint.uri)")
    try:
        return choose(uri, step, lineage, log=log)
    except UserError:
        raise
    except CloudtrainError as exc:
        raise UserError(f"{FLAG} {step}: the checkpoint store {uri} cannot be read or written from here "
                        f"({exc.message})", field=FLAG,
                        remedy="run the submit where the store is reachable with write access, or leave "
                               f"{FLAG} out") from exc


def chain_of(handle: JobHandle | str) -> list[str]:
    """Every submission of the job ``handle`` belongs to, oldest first (its recovery chain, else the handle)."""
    from cloudtrain.jobs import recovery

    parsed = JobHandle.parse(handle) if isinstance(handle, str) else handle
    state = recovery.load(parsed)
    return list(state.chain) if state else [str(parsed)]


def budget_note(handle: JobHandle | str) -> str | None:
    """What the budget watcher did to the job ``handle`` belongs to ("stopped: budget USD ... reached ..."), or
    None."""
    from cloudtrain.plan.cost import recorded

    return (recorded(chain_of(handle)[0]) or {}).get("stopped")


def job_cost(handle: JobHandle | str) -> dict[str, Any]:
    """`cloudtrain cost HANDLE`, ``Run.cost()``: runtime per leg, restarts, list-price cost and spot savings so far,
    across every leg of the job's recovery chain (cloudtrain/plan/cost.py prices them)."""
    from cloudtrain.jobs.budget import Watcher
    from cloudtrain.plan.cost import problem, rate_from

    chain = chain_of(handle)
    found = Watcher(chain)
    total = found.spent()
    return {"handle": str(handle), "root": chain[0], "max_cost": found.max_cost, "stopped": found.stopped,
            "priced": bool(rate_from(found.record)), **total.to_dict(),
            "problems": [said for leg in chain if (said := problem(leg))]}  # cost records not used (stderr too)


def preempt(provider: Provider, handle: JobHandle) -> JobStatus:
    """SIGTERM to every node of a running job, as a spot interruption (`cloudtrain preempt`, ``Run.preempt()``).
    A restart from scratch says why where node 0 found its checkpoint folder empty (a typo'd checkpoint.dir)."""
    status = with_restart_point(provider.preempt(handle))  # refused where not declared (Capability.PREEMPT)
    if status.restart_resumes and status.restart_resumes.startswith("from scratch"):
        from cloudtrain.home import timeline

        said = timeline.empty_folder(timeline.read(provider, handle)["events"])
        if said:
            status.restart_resumes += f" ({said})"
    return status


def logs(provider: Provider, handle: JobHandle, follow: bool = False, merge: bool = False) -> Iterator[str]:
    """A job's log lines, each prefixed with its node. Without ``follow`` they come node by node; ``merge``: ordered
    by time across the nodes, as ``follow`` shows them while the job runs (a provider that can tell when each line
    was written: ``merged_logs``)."""
    if not merge or follow:  # following already interleaves the nodes as their lines arrive
        return provider.logs(handle, follow=follow)
    merged = getattr(provider, "merged_logs", None)
    if merged is None:
        from cloudtrain.errors import UserError

        raise UserError(f"provider {handle.provider!r} cannot order its nodes' log lines by time", field="--merge",
                        remedy="use `cloudtrain logs -f` (it interleaves the nodes while the job runs), or leave "
                               "out --merge (node by node)")
    return merged(handle)
