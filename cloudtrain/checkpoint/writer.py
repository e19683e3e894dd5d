"""One live job per checkpoint URI: the URI's writer lease (stdlib only, Python 3.8).

Two jobs writing to one URI destroy each other's checkpoints: both publish into the same step folders, and each
one's retention deletes the other's (issue 50.5). So a URI has one writer at a time. Node 0 of the job that writes
there holds a lease, ``<uri>/_cloudtrain/writer.json``, with the recovery watchers' mechanics (lineage.claim: write,
wait, read back; lineage.LEASE_SECONDS; a lease further ahead than a lease lasts is not trusted). The lease names who
holds it (job, lineage, platform, host, when renewed), so a job that is refused can say which job it is.

- Node 0 takes the lease before its workers start (``Holder``). A thread renews it every RENEW_SECONDS. The node
  gives it up when the job ends for good (succeeded, failed, stopped) and keeps it on a preemption, to expire: the
  same job's restart takes it back, and no other job slips in meanwhile. A renewal that fails is logged and tried
  again, so one failed renewal never fails training. A lease that could not be renewed for a while is taken back
  unless another job took it.
- A live lease of another lineage refuses the job, with exit 2, naming the holder and the fixes. This happens at
  submit (cloudtrain/plan/submitter.py, before anything is staged) and at node 0's start (a submit that raced
  another's). The exception is a job that takes the URI over (checkpoint.take_over, ``--take-over``,
  CLOUDTRAIN_CHECKPOINT_TAKE_OVER): it takes the lease whatever holds it, and the job that held it loses it.
- A job of the same lineage is the same job (a restart, a resubmit), and is never refused. The newest submission
  writes: the lease lists the jobs it was taken from (``after``). A node of one of those, such as the restart of a
  run that a later submit replaced, stands aside instead of taking the lease back.
- A node that loses its lease (taken over) stops (``on_lost``). Every write into a step folder reads the lease first
  (``check``: the store's uploader, copy_files and publish call it) and is refused where another job's live lease
  holds the URI. The check runs in every writer, whatever process or machine it runs on (node 0's sync, each rank
  of the Checkpointer), and refuses a job that lost the URI from its first write after the loss, before its own
  node notices at the next renewal. The lease is taken at node start rather than at the first publish because then
  a job that may not write learns it before it trains, not one checkpoint interval later (2.5 h with
  ``interval: auto`` on two on-demand nodes).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from cloudtrain import contract
from cloudtrain.backoff import SYSTEM, Clock
from cloudtrain.checkpoint import lineage
from cloudtrain.checkpoint.manifest import step_of
from cloudtrain.errors import UserError

NAME = "writer.json"
HOLDER = "job"  # who holds such leases, in what lineage.lease says of one it does not trust
# The watchers' lease length (2 minutes), renewed four times a lease: three renewals in a row may fail (a store
# briefly unreachable) before another job could take the URI.
RENEW_SECONDS = lineage.LEASE_SECONDS / 4
AFTER_KEPT = 20  # the jobs a lease remembers it was taken from (their late restarts stand aside)


class UriHeld(UserError):
    """A checkpoint URI that another live job writes to (another lineage, or a later submission of this job)."""


class Identity(NamedTuple):
    """Who writes: the job (CLOUDTRAIN_JOB_ID: the same across its restarts), its lineage, and whether it takes the
    URI over from another lineage."""

    job: str
    lineage: str
    take_over: bool = False

    @classmethod
    def of(cls, env: Mapping[str, str] | None = None) -> Identity:
        env = os.environ if env is None else env
        return cls(env.get(contract.JOB_ID, ""), env.get(contract.LINEAGE, ""), env.get(contract.TAKE_OVER) == "1")


def lease_uri(uri: str) -> str:
    return lineage.store_file(uri, NAME)


def read(uri: str, now: float | None = None) -> dict[str, Any] | None:
    """The lease of checkpoint URI ``uri``, if there is one to trust."""
    return lineage.lease(lease_uri(uri), now, holder=HOLDER)


def live(held: dict[str, Any] | None, now: float) -> bool:
    return bool(held) and float(held["expires"]) > now  # type: ignore[index]


def mine(held: dict[str, Any], me: Identity) -> bool:
    """A lease of this very job (any of its nodes, any restart)."""
    if me.job and held.get("job"):
        return bool(held["job"] == me.job)
    return bool(me.lineage) and held.get("lineage") == me.lineage


def same_lineage(held: dict[str, Any], me: Identity) -> bool:
    return bool(me.lineage) and held.get("lineage") == me.lineage


def _seconds(value: Any, now: float) -> str:
    return f"{max(0.0, now - value):.0f}s ago" if lineage.is_number(value) else "at an unknown time"


def describe(held: dict[str, Any], now: float) -> str:
    """``job J (lineage L, on local at host H; renewed 3s ago, its lease runs 117s more)``."""
    facts = [f"lineage {held['lineage']}" if held.get("lineage") else "no lineage",
             *([f"on {held['platform']}"] if held.get("platform") else []),
             *([f"at host {held['host']}"] if held.get("host") else [])]
    left = max(0.0, float(held["expires"]) - now)
    return (f"job {held.get('job') or held['owner']} ({', '.join(facts)}; renewed {_seconds(held.get('renewed'), now)}"
            f", its lease runs {left:.0f}s more)")


def handle_hint(held: dict[str, Any]) -> str:
    """How to stop the holder: its handle where the lease says enough to write it (a local job's), else where to
    find it."""
    if held.get("platform") == "local" and held.get("job"):
        return f"`cloudtrain cancel local://{held['job']}`"
    return "`cloudtrain cancel` with its handle (`cloudtrain list` shows it)"


def refusal(uri: str, held: dict[str, Any], now: float, cancel: str | None = None) -> UriHeld:
    """Why a job of another lineage may not write to ``uri`` while ``held`` lives, and the fixes."""
    return UriHeld(f"the checkpoint URI {uri} is held by another job: {describe(held, now)}; two jobs writing to one "
                   "URI destroy each other's checkpoints",
                   remedy=f"give this job a checkpoint URI of its own (--checkpoint-uri); or stop that job "
                          f"({cancel or handle_hint(held)}); or, once it is gone (a node that vanished holds its "
                          f"lease up to {lineage.LEASE_SECONDS:.0f}s more), submit this job with --take-over")


def before_submit(uri: str, me: Identity, now: float | None = None,
                  cancel: Callable[[dict[str, Any]], str | None] | None = None) -> str | None:
    """The submit's check, before anything is staged or sent: raises UriHeld where a live job of another lineage
    holds ``uri`` (unless ``me`` takes it over); returns a note where this submission will take the URI over when
    its node 0 starts, else None. ``cancel(lease)``: the command that stops the holder, where the caller knows it."""
    now = time.time() if now is None else now
    held = read(uri, now)
    if held is None or not live(held, now) or mine(held, me):
        return None
    if same_lineage(held, me):  # said where that run looks alive (a preempted one's lease outlives it)
        renewed: Any = held.get("renewed")
        if not (lineage.is_number(renewed) and now - renewed < 2 * RENEW_SECONDS):
            return None
        return (f"{uri} is written by another run of this job, {describe(held, now)}: this one takes it over when "
                "its node 0 starts (the newest submission writes), and that run stops")
    if me.take_over:
        return (f"--take-over: {uri} is held by {describe(held, now)}; this job takes it over when its node 0 "
                "starts, and that job stops writing there (its checkpoints stay where they are)")
    raise refusal(uri, held, now, cancel(held) if cancel else None)


def after(held: dict[str, Any]) -> list[str]:
    """The jobs this lease was taken from, oldest first: none of them writes to the URI again."""
    jobs = held.get("after")
    return [j for j in jobs if isinstance(j, str)] if isinstance(jobs, list) else []


def superseded(held: dict[str, Any], me: Identity) -> bool:
    """Whether ``held`` was taken from this very job (a later submission of it, or --take-over): lost for good."""
    return bool(me.job) and me.job in after(held) and held.get("job") != me.job


def may_take(held: dict[str, Any], me: Identity) -> bool:
    """Whether node 0 of ``me``, starting, takes the live lease ``held`` of another owner."""
    if me.job and held.get("job") == me.job:
        return True  # this job's own, from a node that ended (a restart)
    if superseded(held, me):
        return False  # a run that a later submission (or another job's --take-over) replaced stands aside
    return same_lineage(held, me) or me.take_over  # the newest submission of a job writes


# -- the check before every write into a step folder ------------------------------------------------------------

# (checkpoint URI, job) -> why that job may not write there: a URI lost once is never won back by a lease's lapse
_REFUSED: dict[tuple[str, str], str] = {}
_HOLDERS: list[Holder] = []  # this process's (node 0's bootstrap): a refused write wakes them, to stop the node


def check(folder_uri: str) -> None:
    """Before anything is written into the step folder ``folder_uri``: raises UriHeld where another job's live
    lease holds its checkpoint URI, or where the lease was taken from this job (live or not: a URI lost is lost for
    good). A store that cannot be read lets the write go on: the write itself retries, and fails, where the store
    is down."""
    uri, _, name = folder_uri.rstrip("/").rpartition("/")
    if step_of(name) is None:  # not a checkpoint's folder (a node's part): nothing another job publishes
        return
    me = Identity.of()
    why = _REFUSED.get((uri, me.job))
    if why is None:
        now = time.time()
        try:
            held = read(uri, now)
        except Exception:  # any client's error: the write decides
            return
        if held is None or not (superseded(held, me) or (live(held, now) and not mine(held, me))):
            return
        # worded as the node's own renewal says it (Holder._taken): whichever notices first, the job says one thing
        how = "a later submission of this job" if same_lineage(held, me) else "another job (--take-over)"
        whose = (f"the checkpoint URI {uri} was taken over by {how}, {describe(held, now)}" if superseded(held, me)
                 else f"the checkpoint URI {uri} is held by another job, {describe(held, now)}")
        why = _REFUSED[uri, me.job] = f"{whose}: nothing is written to {name}"
        for holder in list(_HOLDERS):
            holder.wake()
    raise UriHeld(why, remedy="one job writes to a checkpoint URI at a time: give this job a URI of its own, or "
                              "stop the other one")


def checker(folder_uri: str) -> Callable[[], None]:
    """``check`` for one batch of writes into a folder: the store is read at the first write (off training's
    thread), and each later write repeats that verdict."""
    verdict: list[UriHeld | None] = []
    lock = threading.Lock()

    def check_once() -> None:
        with lock:
            if not verdict:
                try:
                    check(folder_uri)
                    verdict.append(None)
                except UriHeld as exc:
                    verdict.append(exc)
        if verdict[0] is not None:
            raise UriHeld(verdict[0].message, remedy=verdict[0].remedy)

    return check_once


# -- node 0's lease ----------------------------------------------------------------------------------------------


class Holder:
    """Node 0's lease of its checkpoint URI: taken by ``start`` (the node waits on ``claimed`` before its workers
    start), renewed from a thread, given up or kept by ``finish``. ``on_lost(reason)``: another job took it over."""

    def __init__(self, uri: str, me: Identity, platform: str = "", log: Callable[[str], None] = print,
                 on_lost: Callable[[str], None] | None = None, clock: Clock = SYSTEM,
                 settle: float | None = None) -> None:
        self.uri, self.me, self.log, self.on_lost, self.clock, self.settle = uri, me, log, on_lost, clock, settle
        self.owner = f"{me.job or 'job'}@{lineage.owner_id()}"
        self.about = {"job": me.job, "lineage": me.lineage, "platform": platform, "host": socket.gethostname()}
        self.refused: str | None = None  # why node 0 may not write there (it does not start)
        self.lost: str | None = None  # why it no longer may (another job took the URI over)
        self.failures = 0  # turns failed in a row
        self.held = False  # taken once: another owner from then on took the URI over
        self.started = False  # the node started without waiting for the lease any longer (claimed)
        self._before: dict[str, Any] | None = None  # the lease found when it was taken
        self._claimed, self._wake, self._stop = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudtrain-uri-lease", daemon=True)

    def start(self) -> Holder:
        _HOLDERS.append(self)
        self._thread.start()
        return self

    def claimed(self, timeout: float = lineage.LEASE_SECONDS) -> str | None:
        """Once the lease is taken (or could not be): why this node may not write to its URI, or None. A store
        that does not answer within ``timeout`` holds the node no longer: it starts, and the lease is taken as
        soon as the store answers (every write into a step folder checks it meanwhile)."""
        if not self._claimed.wait(timeout):
            self.started = True
            self.log(f"warning: the lease of the checkpoint URI {self.uri} is not taken yet ({timeout:.0f}s): "
                     "starting without it; it is taken as soon as the store answers")
        return self.refused

    def wake(self) -> None:
        """Renew now: a write was refused (this job may have lost the URI)."""
        self._wake.set()

    def _record(self, held: dict[str, Any] | None) -> dict[str, Any]:
        now = self.clock.time()
        ours = bool(held and held.get("owner") == self.owner)
        jobs = after(held) if held else []
        if held and not ours:
            self._before = held
            if held.get("job") and held["job"] not in jobs:
                jobs.append(str(held["job"]))
        jobs = [j for j in jobs if j != self.me.job][-AFTER_KEPT:]
        since = held.get("since") if held and ours else now
        return {**self.about, "renewed": now, "since": since, "after": jobs}

    def _claim(self, first: bool) -> tuple[bool, dict[str, Any] | None]:
        return lineage.claim(lease_uri(self.uri), self.owner, self.clock, self.settle, log=self.log,
                             record=self._record, holder=HOLDER,
                             may_take=(lambda held: may_take(held, self.me)) if first else None)

    def _run(self) -> None:
        try:
            self._turn(first=True)
        finally:
            self._claimed.set()
        while self.refused is None and self.lost is None:
            self._wake.wait(RENEW_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._turn(first=False)

    def _turn(self, first: bool) -> None:
        """Take the lease (``first``, or while it could not be taken yet) or renew it. A store that fails is said
        and tried again at the next turn: one failed renewal never fails training."""
        taking = first or not self.held
        try:
            now = self.clock.time()
            found = read(self.uri, now)
            if found is not None and found["owner"] != self.owner and (self.held or superseded(found, self.me)):
                why: str | None = self._taken(found, now)  # lost for good, even once the other's lease lapses
            else:
                held, found = self._claim(first=taking)
                why = None if held else self._taken(found, self.clock.time())
        except Exception as exc:
            self.failures += 1
            doing = "taking" if taking else "renewing"
            self.log(f"warning: {doing} the lease of the checkpoint URI {self.uri} failed ({exc}; {self.failures} "
                     f"in a row); trying again in {RENEW_SECONDS:.0f}s")
            return
        if self.failures and why is None:
            self.log(f"checkpoint URI {self.uri}: lease {'taken' if taking else 'renewed'} again, after "
                     f"{self.failures} failure(s)")
        self.failures = 0
        if why is None:
            if taking:
                before, now = self._before, self.clock.time()
                taken = f"; taken over from {describe(before, now)}" if before and live(before, now) else ""
                self.log(f"checkpoint URI {self.uri}: this job writes there (its lease renewed every "
                         f"{RENEW_SECONDS:.0f}s){taken}")
            self.held = True
        elif first and not self.started:
            self.refused = why
        else:  # it held the URI, or the node runs already: it stops
            self.lost = why
            _REFUSED[self.uri, self.me.job] = why
            self.log(f"error: {why}")
            if self.on_lost is not None:
                self.on_lost(why)

    def _taken(self, found: dict[str, Any] | None, now: float) -> str:
        """Why this node may not write to its URI, which ``found``'s holder has."""
        if found is None:
            return f"another job took the lease of the checkpoint URI {self.uri} at the same moment"
        if superseded(found, self.me) or self.held:
            how = "a later submission of this job" if same_lineage(found, self.me) else "another job (--take-over)"
            return (f"the checkpoint URI {self.uri} was taken over by {how}, {describe(found, now)}: this run "
                    "writes no more checkpoints there")
        if same_lineage(found, self.me):
            return (f"a later submission of this job writes to the checkpoint URI {self.uri}: "
                    f"{describe(found, now)}; this run stands aside (the newest submission writes)")
        error = refusal(self.uri, found, now)
        return f"{error.message}; {error.remedy}"

    def finish(self, release: bool) -> None:
        """The node ends: stop renewing; ``release`` (the job ended for good) gives the lease up at once, else (a
        preemption) it is kept to expire, for the job's restart."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2 * RENEW_SECONDS)
        if self in _HOLDERS:
            _HOLDERS.remove(self)
        if not release or self.refused is not None or self.lost is not None:
            return
        try:
            if lineage.release_at(lease_uri(self.uri), self.owner, holder=HOLDER):
                self.log(f"checkpoint URI {self.uri}: lease given up (the job ended)")
        except Exception as exc:
            self.log(f"warning: could not give up the lease of {self.uri} ({exc}); it expires within "
                     f"{lineage.LEASE_SECONDS:.0f}s")
