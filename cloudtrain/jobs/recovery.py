"""Resume after preemption on platforms that do not restart a preempted job themselves (Azure ML; Vertex where a job
ends preempted), and move a job along its fallback list (``provider: [aws, gcp]``) when capacity is gone: wait; if
the job ended preempted and restarts are left, resubmit it (it resumes from its newest checkpoint) and wait again.

Recovery cannot loop: a status call that fails in a way that passes (``TransientError``: a timeout, a 5xx,
throttling) is retried with jittered exponential backoff and never read as a preemption; resubmissions are spaced
the same way; ``max_restarts`` bounds resubmissions on each leg and ``max_recovery`` the time spent recovering in
all (waiting for a resubmitted or moved job to run again, riding out a status outage).

The chain of handles is kept in a state file under the cloudtrain home, written before and after each resubmission,
so a watcher that stops (a closed laptop) picks up where it left off: ``cloudtrain wait HANDLE --recover`` or
``cloudtrain watch``. Each restart has a name fixed by its position in the chain, so a resubmission retried after a
crash finds the job it already created instead of making a second one.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cloudtrain import safe_json
from cloudtrain.backoff import SYSTEM, Backoff, Clock
from cloudtrain.errors import CloudtrainError, TransientError
from cloudtrain.handles import JobHandle
from cloudtrain.home.paths import cloudtrain_home
from cloudtrain.job_types import JobState, JobStatus
from cloudtrain.node.durations import format_duration
from cloudtrain.providers.base import Provider

DEFAULT_MAX_RECOVERY = 24 * 3600.0  # what bounds recovery when neither the spec nor a flag says
RESUBMIT_CAP = 300.0  # the longest pause between two resubmissions
RESTART_NAME_MAX = 60  # within every provider's rule for job names (63 at the shortest), with room to spare


class RecoveryBudgetSpent(CloudtrainError):
    """``max_recovery`` ran out: recovery stops and says where the chain stands."""


@dataclass
class RecoveryState:
    root: str  # the first submission's handle
    max_restarts: int  # per leg
    retry_failed: bool = False
    chain: list[str] = field(default_factory=list)  # every submission, oldest first
    max_recovery: float | None = None  # seconds; None: DEFAULT_MAX_RECOVERY
    recovering_since: float | None = None  # when the current spell of recovering began (a preemption, an outage)
    recovered_s: float = 0.0  # time spent recovering in earlier spells
    # one entry per submission in ``chain``: provider, region, why it was made (submitted / restart / moved: ...)
    history: list[dict[str, Any]] = field(default_factory=list)
    legs: list[dict[str, Any]] = field(default_factory=list)  # the fallback list, in order (cloudtrain.jobs.fallback)
    leg: int = 0  # the leg the newest submission runs on
    spec: dict[str, Any] | None = None  # the job spec, masked, to plan a later leg (only with a fallback list)
    state_uri: str | None = None  # where the watcher keeps this state in the store (cloudtrain.jobs.watcher)
    # where each secret of ``spec`` comes back from when a later leg is planned: a variable of the environment of
    # the process that moves the job (cloudtrain.jobs.chain_file: no file keeps a secret value)
    secrets: list[dict[str, Any]] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return len(self.chain) - 1

    @property
    def leg_restarts(self) -> int:
        """Resubmissions on the current leg (since the job last moved)."""
        if len(self.history) != len(self.chain):  # a state written before the history was kept
            return self.restarts
        count = 0
        for entry in reversed(self.history):
            if not str(entry.get("why", "")).startswith("restart"):
                break
            count += 1
        return count

    @property
    def budget(self) -> float:
        return DEFAULT_MAX_RECOVERY if self.max_recovery is None else self.max_recovery

    def spent(self, now: float) -> float:
        # a spell that began "later than now" (a watcher whose clock ran ahead wrote it) counts from now, so no
        # clock elsewhere makes the time spent negative and the budget endless
        return self.recovered_s + (max(0.0, now - self.recovering_since) if self.recovering_since is not None
                                   else 0.0)

    def trouble(self, now: float) -> None:
        """A spell of recovering begins (or goes on)."""
        if self.recovering_since is None:
            self.recovering_since = now
            save(self)

    def healthy(self, status: JobStatus, now: float) -> None:
        """The job runs (or ended well): the spell of recovering, if any, is over."""
        if self.recovering_since is not None and status.state in (JobState.RUNNING, JobState.SUCCEEDED):
            self.recovered_s += max(0.0, now - self.recovering_since)
            self.recovering_since = None
            save(self)

    @classmethod
    def from_dict(cls, data: Any, origin: str = "the recovery state") -> RecoveryState:
        """The state a file holds, checked field by field (``origin``: the file, named when it is refused)."""
        from cloudtrain.jobs.chain_file import check_state

        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in check_state(data, origin).items() if k in known})


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
        try:  # safe_json: one nested 100,000 deep, a gigabyte or a FIFO in a file's place is skipped like garbage
            data = safe_json.load(path)
        except (OSError, ValueError):  # ValueError: safe_json.UnreadableJson
            continue
        chain = data.get("chain") if isinstance(data, dict) else None
        if isinstance(chain, list) and str(handle) in chain:  # this handle's: used if whole, else refused by name
            return RecoveryState.from_dict(data, str(path))
    return None


def save(state: RecoveryState) -> None:
    from cloudtrain.storage.local import atomic_write

    text = json.dumps(asdict(state), indent=1).encode()
    atomic_write(_path(state.root), lambda out: out.write(text))  # the old chain or the new one, never half of one
    if state.state_uri:  # the copy in the store that watchers share (cloudtrain.jobs.watcher)
        from cloudtrain.checkpoint import lineage

        lineage.write(state.state_uri, asdict(state))


def restart_name(root_job_id: str, restart: int) -> str:
    """The name of restart N of a job: fixed, so a retried resubmission is recognised; at most 60 characters, cut
    from the job's name, never from the stamp that tells two jobs of one name apart."""
    from cloudtrain.naming import shortened

    return shortened(f"{root_job_id}-r{restart}", RESTART_NAME_MAX)


def describe_steady(provider: Provider, handle: JobHandle, *, clock: Clock = SYSTEM,
                    backoff: Backoff | None = None, attempts: int = 8) -> JobStatus:
    """``describe``, retried with backoff while it fails in a way that passes (then the last error is raised)."""
    backoff = backoff or Backoff(base=1.0, cap=30.0)
    for attempt in range(1, attempts + 1):
        try:
            return provider.describe(handle)
        except TransientError:
            if attempt == attempts:
                raise
            clock.sleep(backoff.delay(attempt))
    raise AssertionError("unreachable")


def begin(provider: Provider, handle: JobHandle, *, max_restarts: int | None = None, retry_failed: bool = False,
          max_recovery: float | None = None, clock: Clock = SYSTEM, backoff: Backoff | None = None) -> RecoveryState:
    """The recovery ``handle`` belongs to (resumed from disk), or a new one rooted at it."""
    state = load(handle)
    if state is None:
        limit = max_restarts
        if limit is None:  # the platform remembers what the spec asked for (a tag / label)
            limit = describe_steady(provider, handle, clock=clock, backoff=backoff).max_restarts or 0
        state = RecoveryState(root=str(handle), max_restarts=limit, retry_failed=retry_failed, chain=[str(handle)],
                              max_recovery=max_recovery,
                              history=[{"handle": str(handle), "provider": handle.provider, "why": "submitted",
                                        "leg": 0}])
        save(state)
    else:
        changed = False
        if max_restarts is not None and max_restarts != state.max_restarts:
            state.max_restarts, changed = max_restarts, True
        if max_recovery is not None and max_recovery != state.max_recovery:
            state.max_recovery, changed = max_recovery, True
        if changed:
            save(state)
    return state


def start_chain(handle: JobHandle, *, legs: list[dict[str, Any]], leg: int, spec: dict[str, Any],
                refused: list[str], max_restarts: int, max_recovery: float | None) -> RecoveryState:
    """The recovery of a job submitted from a fallback list: its legs and spec kept, so a watcher (here or
    elsewhere) can move it on. The spec is kept with its secrets masked (the file is shared, in the store): a later
    leg takes them from this process, or from the environment of the watcher that moves the job, said on stderr."""
    import sys

    from cloudtrain.jobs.chain_file import hold, keep, needed
    from cloudtrain.node.secret_values import known_secrets, mask_text

    kept, refs, values = keep(spec)
    hold(str(handle), values)
    why = mask_text("submitted" + (f" ({'; '.join(refused)})" if refused else ""), known_secrets(spec))
    state = RecoveryState(root=str(handle), max_restarts=max_restarts, chain=[str(handle)], max_recovery=max_recovery,
                          history=[{"handle": str(handle), "provider": handle.provider,
                                    "region": legs[leg].get("region"), "why": why, "leg": leg}],
                          legs=legs, leg=leg, spec=kept, secrets=refs)
    save(state)
    if refs and leg + 1 < len(legs):
        print(f"note: no file keeps the job's secret values; a watcher that moves it to a later leg (`cloudtrain "
              f"watch`, `wait --recover`) needs them in its environment: {needed(refs)}", file=sys.stderr)
    return state


def _check_budget(state: RecoveryState, clock: Clock, what: str) -> None:
    now = clock.time()
    if state.spent(now) < state.budget:
        return
    save(state)
    newest = state.chain[-1]
    raise RecoveryBudgetSpent(
        f"recovery gave up: max_recovery {format_duration(state.budget)} is spent "
        f"({format_duration(state.spent(now))} recovering; {what}); {newest} is left as it is "
        f"({state.restarts} resubmission(s) in its chain)",
        remedy=f"check it with `cloudtrain status {newest}`; `cloudtrain wait {newest} --recover --max-recovery "
               "<longer>` goes on with the same chain, `cloudtrain cancel` stops it")


def wait_steady(provider: Provider, handle: JobHandle, *, poll: float, clock: Clock = SYSTEM,
                backoff: Backoff | None = None, state: RecoveryState | None = None,
                deadline: float | None = None, log: Callable[[str], None] = print,
                on_poll: Callable[[JobStatus], None] | None = None) -> JobStatus:
    """Poll until the job ends. A status call that fails in a way that passes is retried with backoff (it says
    nothing about the job); with ``state``, the time that takes and any wait for the job to run again count
    against ``max_recovery``. ``deadline``: a ``clock.time()`` after which waiting stops with an error."""
    backoff = backoff or Backoff(base=poll, cap=max(60.0, poll))
    failures = 0
    while True:
        try:
            status = provider.describe(handle)
        except TransientError as exc:
            failures += 1
            delay = backoff.delay(failures)
            if state is not None:
                state.trouble(clock.time())
                _check_budget(state, clock, f"the status API of {handle} failed {failures} time(s) in a row, last: "
                                            f"{exc.message}")
            if failures == 1 or failures % 10 == 0:
                log(f"status of {handle} unavailable ({exc.message}); not a preemption: retrying in "
                    f"{delay:.1f}s (failure {failures})")
            clock.sleep(delay)
            continue
        if failures:
            log(f"status of {handle} answers again after {failures} failed call(s): {status.state.value}")
            failures = 0
        if state is not None:
            state.healthy(status, clock.time())
        if status.state.terminal:
            return status
        if on_poll:
            on_poll(status)
        if state is not None and state.recovering_since is not None:
            _check_budget(state, clock, f"{handle} is still {status.state.value}")
        if deadline is not None and clock.time() >= deadline:
            raise CloudtrainError(f"{handle} still {status.state.value} after the timeout",
                                  remedy="wait longer (--timeout) or check `cloudtrain logs`")
        clock.sleep(poll)


# (legs, leg, spec, current handle, status, why, log) -> (new handle, its leg): cloudtrain.jobs.fallback.move, passed in
# by the callers that may move a job (the CLI, watch), since fallback plans jobs through the SDK above this module
Mover = Callable[[list[dict[str, Any]], int, dict[str, Any], JobHandle, JobStatus, str, Callable[[str], None]],
                 tuple[JobHandle, int]]


def continues(provider: Provider, state: RecoveryState, status: JobStatus) -> bool:
    """Whether an ended job may be followed by another submission (resubmitted, or moved along its fallback list):
    it was preempted, lost its capacity, or failed where failures are retried. Otherwise its chain has ended."""
    return status.state is JobState.PREEMPTED or bool(provider.capacity_error(status)) or \
        (state.retry_failed and status.state is JobState.FAILED)


def advance(provider: Provider, state: RecoveryState, status: JobStatus, log: Callable[[str], None] = print, *,
            clock: Clock = SYSTEM, backoff: Backoff | None = None, mover: Mover | None = None) -> JobHandle | None:
    """After the newest submission ended with ``status``: the resubmission that continues it (on the same provider,
    or, with ``mover``, on the next leg of its fallback list), or None (done)."""
    current = JobHandle.parse(state.chain[-1])
    capacity = provider.capacity_error(status) if status.state in (JobState.PREEMPTED, JobState.FAILED) else None
    if not continues(provider, state, status):
        return None
    from cloudtrain.jobs.budget import watcher

    if (budget := watcher(state.chain, log)) and budget.reached(status):  # spent: no further restart nor leg
        return None
    state.trouble(clock.time())
    spent = state.leg_restarts >= state.max_restarts
    if (capacity or spent) and state.leg + 1 < len(state.legs) and mover is not None:
        why = f"capacity: {capacity}" if capacity else \
            f"preempted with no restarts left there ({state.leg_restarts}/{state.max_restarts})"
        spec = _spec_for_move(state, current)  # its secrets from this process: refused before anything is sent
        _pause(state, clock, backoff, log)
        new, leg = mover(state.legs, state.leg, spec, current, status, why, log)
        _record(state, new, leg, f"moved: {why}")
        return new
    if spent or capacity:
        log(f"{current} ended {status.state.value}{f' ({capacity})' if capacity else ''}; no restarts left "
            f"({state.leg_restarts}/{state.max_restarts})" + (" and no further provider in its fallback list"
                                                               if state.legs else ""))
        return None
    restart = state.restarts + 1
    _pause(state, clock, backoff, log)
    new = provider.resubmit(current, restart_name(JobHandle.parse(state.root).job_id, restart))
    _record(state, new, state.leg, "restart after preemption")
    log(f"{current} ended {status.state.value}; resubmitted as {new} (restart {state.leg_restarts}/"
        f"{state.max_restarts}), resuming from its newest checkpoint if it has a checkpoint.uri")
    return new


def _spec_for_move(state: RecoveryState, current: JobHandle) -> dict[str, Any]:
    from cloudtrain.jobs.chain_file import fill

    following = state.legs[state.leg + 1]
    where = following.get("provider", "?") + (f" {following['region']}" if following.get("region") else "")
    return fill(state.spec or {}, state.secrets, state.root, f"moving {current} to {where}")


def _pause(state: RecoveryState, clock: Clock, backoff: Backoff | None, log: Callable[[str], None]) -> None:
    """Space resubmissions (jittered, exponential in the chain's length, capped): a platform that takes jobs and
    loses them at once is not hammered."""
    if backoff is None:
        return
    delay = backoff.delay(state.restarts + 1)
    _check_budget(state, clock, "before resubmitting")
    if delay >= 1:
        log(f"resubmitting in {delay:.0f}s")
    clock.sleep(delay)


def _record(state: RecoveryState, new: JobHandle, leg: int, why: str) -> None:
    state.chain.append(str(new))
    region = (state.legs[leg].get("region") if leg < len(state.legs) else None)
    state.history.append({"handle": str(new), "provider": new.provider, "region": region, "why": why, "leg": leg})
    state.leg = leg
    save(state)
    # the chain's story: in the first job's timeline, and the new job's own
    from cloudtrain.home import measured, timeline

    kind = "moved" if why.startswith("moved") else "restarted"
    timeline.record(state.root, kind, to=str(new), provider=new.provider, region=region, leg=leg, why=why[:200])
    before = state.chain[-2] if len(state.chain) > 1 else state.root
    # a restart runs what ran before (same provider, machine, nodes, spot, name: what its run measures for
    # checkpoint.interval auto); a move's own submission recorded its own
    same = measured.key_of(timeline.own_events(before)[0]) if kind == "restarted" else None
    timeline.record(str(new), "submitted", handle=str(new), **{**(same or {}), "provider": new.provider},
                    region=region, leg=leg, resubmission_of=before)


def wait_with_recovery(provider: Provider, handle: JobHandle, *, max_restarts: int | None = None,
                       retry_failed: bool = False, timeout: float | None = None, poll: float = 5.0,
                       max_recovery: float | None = None, log: Callable[[str], None] = print,
                       clock: Clock = SYSTEM, backoff: Backoff | None = None, mover: Mover | None = None) -> JobStatus:
    """Wait for the job (and its restarts) to end; resubmit while it ends preempted and restarts are left."""
    state = begin(provider, handle, max_restarts=max_restarts, retry_failed=retry_failed, max_recovery=max_recovery,
                  clock=clock, backoff=backoff)
    return drive(provider, state, poll=poll, timeout=timeout, log=log, clock=clock, backoff=backoff, mover=mover)


def drive(provider: Provider, state: RecoveryState, *, poll: float, timeout: float | None = None,
          log: Callable[[str], None] = print, clock: Clock = SYSTEM, backoff: Backoff | None = None,
          mover: Mover | None = None, resolve: Callable[[str], Provider] | None = None) -> JobStatus:
    """Follow ``state``'s chain to its end: what ``wait --recover`` and ``watch`` run. ``backoff``: between
    status retries (default: from ``poll`` up to a minute); ``resolve``: a provider by name (default: the
    registry's)."""
    from cloudtrain.jobs.budget import Watcher, watcher

    budget = watcher(state.chain, log)  # max_cost: each poll prices every leg; spent, the running one is stopped
    deadline = None if timeout is None else clock.time() + timeout
    pacing = Backoff(base=poll, cap=max(RESUBMIT_CAP, poll))
    if backoff is not None:
        pacing.rng = backoff.rng  # one seeded source (a replay is repeatable)
    current: JobHandle | None = JobHandle.parse(state.chain[-1])
    while True:
        assert current is not None
        if current.provider != provider.name:
            from cloudtrain.providers import get_provider

            provider = (resolve or get_provider)(current.provider)
        status = wait_steady(provider, current, poll=poll, clock=clock, backoff=backoff, state=state,
                             deadline=deadline, log=log,
                             on_poll=functools.partial(budget.poll, provider) if budget else None)
        current = advance(provider, state, status, log, clock=clock, backoff=pacing, mover=mover)
        if current is None:
            status.recovery = {"chain": state.chain, "restarts": state.restarts, "history": state.history}
            if budget and (stopped := Watcher(state.chain).stopped):  # by a poll, or by advance at a leg's end
                status.recovery["budget"] = stopped
            return status
