"""``cloudtrain watch [HANDLE ...]``: recovery without a laptop. A small loop to leave running anywhere (a VM, a
container, a CI runner) that drives many job chains at once: each round it reads every chain's newest job and, when
one ended preempted or lost its capacity, resubmits or moves it (cloudtrain.recovery / cloudtrain.fallback).

Idempotent and shareable: each chain's state is kept in its checkpoint store (cloudtrain.lineage_store), so a
restarted watcher, or one on another machine with an empty home, picks up the same chain; a lease in the store lets
one watcher at a time act on a chain, and resubmissions have fixed names, so nothing is submitted twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cloudtrain import lineage_store
from cloudtrain.backoff import SYSTEM, Backoff, Clock
from cloudtrain.errors import TransientError
from cloudtrain.handles import JobHandle
from cloudtrain.providers import get_provider
from cloudtrain.providers.base import JobStatus
from cloudtrain.recovery import RESUBMIT_CAP, RecoveryState, advance, begin, load, save

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
        where = lineage_store.state_uri(uri) if uri else None
    shared = lineage_store.read(where) if where else None
    if shared and str(handle) in shared.get("chain", []) and \
            (local is None or len(shared["chain"]) >= len(local.chain)):
        state = RecoveryState.from_dict(shared)
        log(f"{handle}: picked up its chain from {where} ({len(state.chain)} submission(s))")
    else:
        state = local or begin(provider, handle)
    if where and state.state_uri != where:
        state.state_uri = where
    save(state)  # in this home and in the store
    if where is None:
        log(f"{handle} has no checkpoint.uri: its chain is kept in this home only (no other watcher sees it)")
    return state


def round_once(watched: list[Watched], owner: str, *, poll: float, clock: Clock = SYSTEM, log: Log = print,
               mover: object = None) -> None:
    """One look at every chain still running: act on those that ended, if this watcher holds their lease."""
    for item in watched:
        if item.final is not None:
            continue
        state = item.state
        if state.state_uri:
            held = lineage_store.take_lease(state.state_uri, owner, clock)
            fresh = lineage_store.read(state.state_uri)  # what another watcher may have done meanwhile
            if fresh and len(fresh.get("chain", [])) > len(state.chain):
                item.state = state = RecoveryState.from_dict(fresh)
            if not held:
                continue
        handle = JobHandle.parse(state.chain[-1])
        provider = get_provider(handle.provider)
        try:
            status = provider.describe(handle)
        except TransientError as exc:
            log(f"{handle}: status unavailable ({exc.message}); not a preemption, next round")
            state.trouble(clock.time())
            continue
        state.healthy(status, clock.time())
        if not status.state.terminal:
            continue
        following = advance(provider, state, status, log, clock=clock,
                            backoff=Backoff(base=poll, cap=max(RESUBMIT_CAP, poll)), mover=mover)  # type: ignore[arg-type]
        if following is None:
            item.final = status
            log(f"{state.root}: chain ended {status.state.value} ({status.handle}, {state.restarts} resubmission(s))")
            if state.state_uri:
                lineage_store.release(state.state_uri, owner)


def watch(handles: list[JobHandle], *, poll: float = 30.0, clock: Clock = SYSTEM, log: Log = print,
          owner: str | None = None, rounds: int | None = None, mover: object = None) -> list[Watched]:
    """Drive every chain until each has ended (or ``rounds`` rounds went by)."""
    owner = owner or lineage_store.owner_id()
    watched = [Watched(attach(h, log)) for h in handles]
    done = 0
    while any(w.final is None for w in watched) and (rounds is None or done < rounds):
        round_once(watched, owner, poll=poll, clock=clock, log=log, mover=mover)
        done += 1
        if any(w.final is None for w in watched):
            clock.sleep(poll)
    return watched
