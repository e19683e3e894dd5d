"""``cloudtrain watch [HANDLE ...]``: recovery without a laptop. A small loop to leave running anywhere (a VM, a
container, a CI runner) that drives many job chains at once: each round it reads every chain's newest job and, when
one ended preempted or lost its capacity, resubmits or moves it (cloudtrain.jobs.recovery / cloudtrain.jobs.fallback).

Idempotent and shareable: each chain's state is kept in its checkpoint store (cloudtrain.checkpoint.lineage), so a
restarted watcher, or one on another machine with an empty home, picks up the same chain; a lease in the store lets
one watcher at a time act on a chain, and resubmissions have fixed names, so nothing is submitted twice. What the
store holds is checked before it is used (cloudtrain.jobs.chain_file): a chain file of another shape is named with the
fix, and a chain whose newest job ended for good needs no lease to be seen as ended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cloudtrain.backoff import SYSTEM, Backoff, Clock
from cloudtrain.checkpoint import lineage
from cloudtrain.checkpoint.lineage import Unreadable
from cloudtrain.errors import CloudtrainError, TransientError
from cloudtrain.handles import JobHandle
from cloudtrain.job_types import JobStatus
from cloudtrain.jobs.recovery import RESUBMIT_CAP, RecoveryState, advance, begin, continues, load, save
from cloudtrain.providers import get_provider

Log = Callable[[str], None]


@dataclass
class Watched:
    state: RecoveryState
    final: JobStatus | None = None  # set once the chain has ended


def attach(handle: JobHandle, log: Log = print) -> RecoveryState:
    """The chain ``handle`` belongs to: the store's copy (another watcher's, or this one's before a restart) when it
    is further along than the one in this home, else this home's, else a new one; kept in the store from now on."""
    provider = get_provider(handle.provider)
    local = load(handle)
    where = local.state_uri if local and local.state_uri else None
    if where is None:
        uri = provider.describe(handle).checkpoint_uri
        where = lineage.state_uri(uri) if uri else None
    try:
        shared = read_shared(where) if where else None
    except Unreadable as exc:
        if local is None:  # nothing else says where the chain stands: the user decides (exit 2)
            raise
        shared = None
        log(f"{exc.message}; this home's copy of the chain replaces it")
    if shared and str(handle) in shared.chain and (local is None or len(shared.chain) >= len(local.chain)):
        state = shared
        log(f"{handle}: picked up its chain from {where} ({len(state.chain)} submission(s))")
    else:
        state = local or begin(provider, handle)
    if where and state.state_uri != where:
        state.state_uri = where
    save(state)  # in this home and in the store
    if where is None:
        log(f"{handle} has no checkpoint.uri: its chain is kept in this home only (no other watcher sees it)")
    return state


def read_shared(uri: str) -> RecoveryState | None:
    """The chain state a store keeps at ``uri``, checked (Unreadable, naming the file, when it is not one)."""
    data = lineage.read(uri)
    return None if data is None else RecoveryState.from_dict(data, uri)


def round_once(watched: list[Watched], owner: str, *, poll: float, clock: Clock = SYSTEM, log: Log = print,
               mover: object = None) -> None:
    """One look at every chain still running: act on those that ended, if this watcher holds their lease; a chain
    whose newest job ended for good is over whoever holds it."""
    for item in watched:
        if item.final is not None:
            continue
        state, held = item.state, True
        if state.state_uri:
            held = lineage.take_lease(state.state_uri, owner, clock, log=log)
            try:
                fresh = read_shared(state.state_uri)  # what another watcher may have done meanwhile
            except Unreadable as exc:  # this watcher's copy stands; its next save replaces the file
                fresh = None
                log(f"{exc.message}; this watcher's copy of the chain stands")
            if fresh and len(fresh.chain) > len(state.chain) and fresh.chain[:len(state.chain)] == state.chain:
                item.state = state = fresh
        handle = JobHandle.parse(state.chain[-1])
        provider = get_provider(handle.provider)
        try:
            status = provider.describe(handle)
        except TransientError as exc:
            log(f"{handle}: status unavailable ({exc.message}); not a preemption, next round")
            if held:
                state.trouble(clock.time())
            continue
        if not held:  # another watcher acts on the chain; an end nothing follows needs none
            if status.state.terminal and not continues(provider, state, status):
                item.final = status
                log(f"{state.root}: chain ended {status.state.value} ({status.handle}, {state.restarts} "
                    "resubmission(s))")
            continue
        state.healthy(status, clock.time())
        if not status.state.terminal:
            continue
        try:
            following = advance(provider, state, status, log, clock=clock,
                                backoff=Backoff(base=poll, cap=max(RESUBMIT_CAP, poll)), mover=mover)  # type: ignore[arg-type]
        except CloudtrainError:
            if state.state_uri:  # another watcher (one with the job's secrets, say) may take the chain at once
                lineage.release(state.state_uri, owner)
            raise
        if following is None:
            item.final = status
            log(f"{state.root}: chain ended {status.state.value} ({status.handle}, {state.restarts} resubmission(s))")
            if state.state_uri:
                lineage.release(state.state_uri, owner)


def watch(handles: list[JobHandle], *, poll: float = 30.0, clock: Clock = SYSTEM, log: Log = print,
          owner: str | None = None, rounds: int | None = None, mover: object = None) -> list[Watched]:
    """Drive every chain until each has ended (or ``rounds`` rounds went by)."""
    owner = owner or lineage.owner_id()
    watched = [Watched(attach(h, log)) for h in handles]
    done = 0
    while any(w.final is None for w in watched) and (rounds is None or done < rounds):
        round_once(watched, owner, poll=poll, clock=clock, log=log, mover=mover)
        done += 1
        if any(w.final is None for w in watched):
            clock.sleep(poll)
    return watched
