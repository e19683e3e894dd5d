"""Resume after preemption on platforms that do not restart a preempted job themselves (Azure ML; Vertex where a job
ends preempted): wait; if the job ended preempted and restarts are left, resubmit it (it resumes from its newest
checkpoint) and wait again.

The chain of handles is kept in a state file under the cloudtrain home, written before and after each resubmission,
so a watcher that stops (a closed laptop) picks up where it left off: ``cloudtrain wait HANDLE --recover``. Each
restart has a name fixed by its position in the chain, so a resubmission retried after a crash finds the job it
already created instead of making a second one.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cloudtrain.handles import JobHandle
from cloudtrain.home import cloudtrain_home
from cloudtrain.providers.base import JobState, JobStatus, Provider


@dataclass
class RecoveryState:
    root: str  # the first submission's handle
    max_restarts: int
    retry_failed: bool = False
    chain: list[str] = field(default_factory=list)  # every submission, oldest first

    @property
    def restarts(self) -> int:
        return len(self.chain) - 1


def state_dir() -> Path:
    return cloudtrain_home() / "recovery"


def _path(root: str) -> Path:
    return state_dir() / (re.sub(r"[^A-Za-z0-9._-]+", "_", root) + ".json")


def load(handle: JobHandle) -> RecoveryState | None:
    """The recovery this handle belongs to (as its root or any later submission), if one was started here."""
    folder = state_dir()
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if str(handle) in data.get("chain", []):
            return RecoveryState(**data)
    return None


def save(state: RecoveryState) -> None:
    path = _path(state.root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=1))
    os.replace(tmp, path)  # a reader sees the old chain or the new one, never half of one


def restart_name(root_job_id: str, restart: int) -> str:
    """The name of restart N of a job: fixed, so a retried resubmission is recognised (at most 60 characters)."""
    return f"{root_job_id[:55]}-r{restart}"


def begin(provider: Provider, handle: JobHandle, *, max_restarts: int | None = None,
          retry_failed: bool = False) -> RecoveryState:
    """The recovery ``handle`` belongs to (resumed from disk), or a new one rooted at it."""
    state = load(handle)
    if state is None:
        limit = max_restarts
        if limit is None:  # the platform remembers what the spec asked for (a tag / label)
            limit = provider.describe(handle).max_restarts or 0
        state = RecoveryState(root=str(handle), max_restarts=limit, retry_failed=retry_failed, chain=[str(handle)])
        save(state)
    elif max_restarts is not None and max_restarts != state.max_restarts:
        state.max_restarts = max_restarts
        save(state)
    return state


def advance(provider: Provider, state: RecoveryState, status: JobStatus,
            log: Callable[[str], None] = print) -> JobHandle | None:
    """After the newest submission ended with ``status``: the resubmission that continues it, or None (done)."""
    current = JobHandle.parse(state.chain[-1])
    again = status.state is JobState.PREEMPTED or (state.retry_failed and status.state is JobState.FAILED)
    if not again:
        return None
    from cloudtrain.budget import watcher

    if (budget := watcher(state.chain, log)) and budget.reached(status):  # spent: no further leg
        return None
    if state.restarts >= state.max_restarts:
        log(f"{current} ended {status.state.value}; no restarts left ({state.restarts}/{state.max_restarts})")
        return None
    restart = state.restarts + 1
    new = provider.resubmit(current, restart_name(JobHandle.parse(state.root).job_id, restart))
    state.chain.append(str(new))
    save(state)
    log(f"{current} ended {status.state.value}; resubmitted as {new} (restart {restart}/{state.max_restarts}), "
        "resuming from its newest checkpoint if it has a checkpoint.uri")
    return new


def wait_with_recovery(provider: Provider, handle: JobHandle, *, max_restarts: int | None = None,
                       retry_failed: bool = False, timeout: float | None = None, poll: float = 5.0,
                       log: Callable[[str], None] = print) -> JobStatus:
    """Wait for the job (and its restarts) to end; resubmit while it ends preempted and restarts are left."""
    from cloudtrain.budget import Watcher, watcher

    state = begin(provider, handle, max_restarts=max_restarts, retry_failed=retry_failed)
    budget = watcher(state.chain, log)  # max_cost: each poll prices every leg; spent, the running one is stopped
    deadline = None if timeout is None else time.monotonic() + timeout
    current: JobHandle | None = JobHandle.parse(state.chain[-1])
    while True:
        assert current is not None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        status = provider.wait(current, timeout=left, poll=poll,
                               on_poll=(lambda s: budget.poll(provider, s)) if budget else None)
        current = advance(provider, state, status, log)
        if current is None:
            status.recovery = {"chain": state.chain, "restarts": state.restarts}
            if budget and (stopped := Watcher(state.chain).stopped):  # by a poll, or by advance at a leg's end
                status.recovery["budget"] = stopped
            return status
