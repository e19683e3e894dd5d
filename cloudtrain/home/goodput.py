"""Progress and goodput from a job's timeline (cloudtrain/home/timeline.py, every event screened by
cloudtrain/home/event_schema.py): the step, steps/s and ETA, the ideal step time, and the share of paid node time
that produced steps which were kept, with the losses in the buckets Google's ml-goodput-measurement uses.

The timeline is cut into legs: each start of the job's nodes (the local supervisor's ``node_started``; elsewhere the
platform's move to running as status saw it, placed at its reference node's first event, else the job's start
time) until the next start, its preemption or its end. Paid time is the legs' time. In each leg:
- ``infrastructure`` (provisioning and recovery): the leg's start until its reference node's bootstrap ran
  (``node_started``);
- ``program_startup``: from there until training (its first step, checkpoint or training again), less the restore;
- ``checkpoint_restore``: the node's restore (``restored.seconds``) and the workers' load (``training_again.load_s``);
- ``checkpoint_save``: the time checkpoints blocked training (``blocked_s``);
- ``data_loading``: the seconds a step report says it waited for data (``report_step(..., data_s=...)``);
- ``wasted_progress``: steps done again after a restore (the newest step reached before it, less the restored step)
  at the pure step rate;
- ``other``: what none of these explains (the last save and exit, time between two step reports).
Kept time is the kept steps at the pure step rate. ``waiting`` (submitted until the first start) is not paid.

The clock rule: a leg's start and end are this machine's (or the platform's) times; inside a leg only the reference
node's events count (the node whose worker reports the steps: rank 0's), each moved into the leg, so node clocks
are compared only with themselves and a skewed node cannot stretch what is paid.

A job that cloudtrain's recovery resubmitted (or moved to another provider) is a chain of submissions, each with
its own handle and timeline: ``summarise_chain`` cuts each submission into its legs and sums them, so the steps the
newer submission redid after restoring count as lost, and the time between two submissions (nothing running) is
not paid.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

STEP_KINDS = ("step", "checkpoint", "training_again", "restored")


@dataclass(frozen=True)
class _State:
    value: str
    terminal: bool


@dataclass(frozen=True)
class Ended:
    """An earlier submission of a chain, as its own timeline last saw it (its status is not asked again)."""

    state: _State
    ended_at: float | None
    started_at: float | None = None
    created_at: float | None = None

    @classmethod
    def of(cls, events: list[dict[str, Any]], next_submitted: float | None) -> Ended:
        """From the submission's ``ended`` event; one whose end was never seen ended when the next was submitted."""
        ended = next((e for e in reversed(events) if e["e"] == "ended"), None)
        if ended is None:
            return cls(_State("preempted", True), next_submitted)
        return cls(_State(str(ended.get("state")), True), ended.get("ended_at") or ended["t"])


def reference_node(events: list[dict[str, Any]]) -> Any:
    """The node whose clock a leg is measured on: the one the step reports and checkpoints come from (rank 0's),
    else node 0, else the first node named."""
    from collections import Counter

    said = Counter(e["node"] for e in events if "node" in e and e["e"] in STEP_KINDS)
    if said:
        return said.most_common(1)[0][0]
    nodes = [e["node"] for e in events if "node" in e]
    return 0 if 0 in nodes else (nodes[0] if nodes else None)


def _on_reference(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events a leg's figures are made of: the home's own and the reference node's."""
    ref = reference_node(events)
    return [e for e in events if "node" not in e or e["node"] == ref]


def _legs(events: list[dict[str, Any]], status: Any) -> list[tuple[float, float, list[dict[str, Any]]]]:
    """(start, stop, the leg's events) of each leg, its events the reference node's and the home's, each moved into
    the leg (a node's clock a little off cannot put a step before the leg began). Linear in the events whatever the
    number of legs (a crash loop of a month has tens of thousands)."""
    events = sorted(_on_reference(events), key=lambda e: e["t"])
    times = [e["t"] for e in events]
    starts: dict[Any, float] = {}
    for e in events:
        if e["e"] == "node_started" and "attempt" in e:  # the local supervisor's (a node's own names its rank)
            starts.setdefault(e["attempt"], e["t"])
    begin = sorted(starts.values())
    if not begin:
        begin = [e["t"] for e in events if e["e"] == "state" and e.get("state") == "running"]  # each a new start
        begin = _seen_late(begin, events, status.started_at)
    if not begin and status.started_at is not None:
        begin = [float(status.started_at)]
    end_of_job = status.ended_at or next((e["t"] for e in reversed(events) if e["e"] == "ended"), None) or (
        None if status.state.terminal else time.time())
    legs = []
    for i, start in enumerate(begin):
        last = i + 1 == len(begin)
        until = max(end_of_job or start, start) if last else begin[i + 1]
        lo = bisect_left(times, start)
        stop = next((e["t"] for e in events[lo:bisect_right(times, until)] if e["e"] == "preempted"), until)
        own = [e if e["t"] <= stop else {**e, "t": stop}
               for e in events[lo:len(events) if last else bisect_left(times, until)]]
        legs.append((start, max(start, stop), own))
    return legs


def _seen_late(begin: list[float], events: list[dict[str, Any]], started_at: float | None) -> list[float]:
    """A platform's move to running is recorded when a status call sees it, which may be after its nodes' first
    events: each start is moved back to the reference node's first event since the start before it (and the first
    to the platform's own start time, where it says one)."""
    node_times = sorted(e["t"] for e in events if "node" in e)
    moved: list[float] = []
    for i, start in enumerate(begin):
        floor = moved[-1] if moved else float("-inf")
        early = node_times[bisect_right(node_times, floor):][:1]
        if i == 0 and started_at is not None:
            early.append(float(started_at))
        moved.append(min([start, *early]))
    return moved


def summarise(events: list[dict[str, Any]], status: Any, rate: Any = None) -> dict[str, Any]:
    """``{"progress": {...}, "goodput": {...}}`` for ``status -o json`` (None where a figure is not known)."""
    return summarise_chain([(events, status, rate)])


CAUSES = ("infrastructure", "program_startup", "data_loading", "checkpoint_save", "checkpoint_restore",
          "wasted_progress")


def _leg_losses(start: float, stop: float, own: list[dict[str, Any]], losses: dict[str, float], told: bool
                ) -> tuple[list[dict[str, Any]], float, float]:
    """Add one leg's losses; (its training events, its restore's seconds, the seconds training was blocked).
    Training began at the leg's first step report, checkpoint or training again (a stack's checkpoint may carry no
    step); a leg with none never trained where the job ``told`` of its work elsewhere (its start-up is the whole
    leg), and is not known to have started where it never did (what follows its node's start is then ``other``)."""
    def seconds(value: Any) -> float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

    paid = stop - start
    restored = next((e for e in own if e["e"] == "restored"), None)
    again = next((e for e in own if e["e"] == "training_again"), None)
    trained = [e for e in own if e["e"] in ("step", "checkpoint", "training_again") and isinstance(e.get("step"), int)]
    up = next((e["t"] for e in own if e["e"] == "node_started" and "attempt" not in e), None)
    began = next((e["t"] for e in own if e["e"] in ("step", "checkpoint", "training_again")), stop if told else None)
    up = start if up is None or (began is not None and up > began) else up
    if began is None:
        losses["infrastructure"] += up - start
        return trained, 0.0, 0.0
    restore = min(seconds(restored.get("seconds") if restored else 0) + seconds(again.get("load_s") if again else 0),
                  max(0.0, began - up))
    losses["infrastructure"] += up - start
    losses["program_startup"] += max(0.0, began - up - restore)
    losses["checkpoint_restore"] += restore
    room = max(0.0, stop - began)  # what training can have lost to saves and data: no more than it had
    blocked = min(room, sum(seconds(e.get("blocked_s")) for e in own if e["e"] == "checkpoint"))
    data = min(room - blocked, sum(seconds(e.get("data_s")) for e in own if e["e"] == "step"))
    losses["checkpoint_save"] += blocked
    losses["data_loading"] += data
    assert paid >= 0
    return trained, restore, blocked + data


def step_times(legs: list[tuple[float, float, list[dict[str, Any]]]]) -> dict[str, float | None]:
    """The ideal step time as ml-goodput-measurement defines it (the mean of the step times no longer than the
    median + 3 x their median absolute deviation), the recent step time (the median of the last five), and the
    deviation: how much slower than the ideal the recent steps are (0 when they are not: an alert on it is an alert
    on a slowdown). Step times are taken between two step reports of one leg, less the time
    checkpoints blocked and data was waited for between them, per step."""
    from statistics import mean, median

    times: list[float] = []
    for _start, _stop, own in legs:
        last, held = None, 0.0
        for e in own:  # in time order: the saves since the last step report are what blocked the steps since it
            if e["e"] == "checkpoint":
                held += float(e.get("blocked_s") or 0)
            elif e["e"] == "step":
                if last is not None and e["step"] > last["step"] and e["t"] > last["t"]:
                    waited = held + float(e.get("data_s") or 0)
                    times.append(max(0.0, e["t"] - last["t"] - waited) / (e["step"] - last["step"]))
                last, held = e, 0.0
    if not times:
        return {"ideal": None, "recent": None, "deviation": None}
    mid = median(times)
    mad = median(abs(x - mid) for x in times)
    ideal = mean([x for x in times if x <= mid + 3 * mad])
    recent = median(times[-5:])
    return {"ideal": round(ideal, 6), "recent": round(recent, 6), "deviation": round(max(0.0, recent - ideal), 6)}


def summarise_chain(parts: list[tuple[list[dict[str, Any]], Any, Any]]) -> dict[str, Any]:
    """The figures of a chain of submissions: ``(events, status, rate)`` of each, oldest first (an earlier one's
    status an ``Ended``); the newest's status says whether the job still runs. One part: one submission."""
    status = parts[-1][1]
    own_legs = [_legs(events_k, status_k) for events_k, status_k, _ in parts]  # each submission's, cut once
    legs = [leg for part in own_legs for leg in part]
    events = _merged([events_k for events_k, _, _ in parts])
    steps_seen = [e for e in _on_reference(events) if e["e"] in STEP_KINDS and isinstance(e.get("step"), int)]
    total = next((e["total"] for e in reversed(events) if e["e"] == "step" and isinstance(e.get("total"), int)), None)
    paid = sum(stop - start for start, stop, _ in legs)
    losses = dict.fromkeys(CAUSES, 0.0)
    span = steps = 0.0
    redone_steps, reached, first_step = 0, None, None
    last_rate = None
    told = any(e["e"] in ("step", "checkpoint", "training_again") for e in events)
    for n, (start, stop, own) in enumerate(legs):
        trained, _restore, held = _leg_losses(start, stop, own, losses, told)
        restored = next((e for e in own if e["e"] == "restored"), None)
        begun = restored["step"] if restored and isinstance(restored.get("step"), int) else 0
        if n == 0:
            first_step = begun
        elif reached is not None:
            redone_steps += max(0, reached - begun)
        if len(trained) >= 2 and trained[-1]["t"] > trained[0]["t"]:
            leg_span = trained[-1]["t"] - trained[0]["t"]
            leg_steps = trained[-1]["step"] - trained[0]["step"]
            span += max(0.0, leg_span - held)
            steps += max(0, leg_steps)
            if leg_steps > 0:
                last_rate = leg_steps / leg_span  # the newest leg's that has one: a leg just started has none yet
        if trained:
            reached = max(reached or 0, max(e["step"] for e in trained))
    step = steps_seen[-1]["step"] if steps_seen else None
    pure = steps / span if span > 0 and steps > 0 else None
    kept_steps = None if step is None else max(0, step - (first_step or 0))
    kept = min(paid, kept_steps / pure) if pure and kept_steps is not None else None
    if pure:
        losses["wasted_progress"] = min(redone_steps / pure, max(0.0, paid - (kept or 0)))
    waiting = None
    submitted = next((e["t"] for e in events if e["e"] == "submitted"), status.created_at)
    if legs and submitted is not None:
        waiting = max(0.0, legs[0][0] - float(submitted))
    other = max(0.0, paid - (kept or 0) - sum(losses.values())) if kept is not None else None
    checkpoints = [e for e in events if e["e"] == "checkpoint"]
    eta = (total - step) / last_rate if total and step is not None and last_rate and not status.state.terminal \
        else None
    progress = {"step": step, "total": total, "percent": round(100.0 * step / total, 1) if total and step is not None
                else None, "steps_per_s": round(last_rate, 3) if last_rate else None,
                "eta_s": round(max(0.0, eta), 1) if eta is not None else None,
                "source": "report_step" if any(e["e"] == "step" for e in events) else
                ("checkpoints" if steps_seen else None)}
    goodput = {"ratio": round(min(1.0, kept / paid), 4) if kept is not None and paid > 0 else None,
               "paid_s": round(paid, 3), "kept_s": round(kept, 3) if kept is not None else None,
               "losses_s": {"waiting": round(waiting, 3) if waiting is not None else None,
                            **{k: round(v, 3) for k, v in losses.items()},
                            "other": round(other, 3) if other is not None else None},
               "step_time_s": step_times(legs),
               "steps_redone": redone_steps, "legs": len(legs),
               # the local supervisor's per attempt, or the platform's states as status saw them (not both)
               "preemptions": max(len({e.get("attempt") for e in events if e["e"] == "preempted"}), sum(
                   1 for e in events if e["e"] in ("ended", "state") and e.get("state") == "preempted")),
               "checkpoints": len(checkpoints),
               # an ended job's newest checkpoint does not grow older: there is nothing left to lose
               "checkpoint_age_s": round(max(0.0, time.time() - checkpoints[-1]["t"]), 1)
               if checkpoints and not status.state.terminal else None,
               **_interval(events), "submissions": len(parts),
               **_cost([(sum(stop - start for start, stop, _ in part), rate)
                        for part, (_, _, rate) in zip(own_legs, parts, strict=True)], kept)}
    return {"progress": progress, "goodput": goodput}


def _merged(timelines: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One timeline of a chain's submissions, by time; each submission's attempts (the local supervisor's numbers,
    which start again at 0) kept apart."""
    if len(timelines) == 1:
        return timelines[0]
    merged = [{**e, "attempt": f"{k}:{e['attempt']}"} if "attempt" in e else e
              for k, events in enumerate(timelines) for e in events]
    return sorted(merged, key=lambda e: e["t"])


def _interval(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint interval the job runs with, as its newest submission with one said (the plan's choice)."""
    said = next((e for e in reversed(events) if e["e"] == "submitted" and "checkpoint_interval_s" in e), None)
    return {"checkpoint_interval_s": said["checkpoint_interval_s"] if said else None,
            "checkpoint_interval_from": said.get("checkpoint_interval_from") if said else None}


def _cost(paid_at: list[tuple[float, Any]], kept: float | None) -> dict[str, Any]:
    """Cost so far (each submission's paid time at its price) next to what on-demand nodes would cost for the kept
    work (at the newest submission's on-demand price)."""
    if not paid_at or any(rate is None or rate.hourly is None for _, rate in paid_at):
        return {"cost_usd": None, "on_demand_kept_usd": None}
    rate = paid_at[-1][1]
    on_demand = None if kept is None or rate.on_demand is None else kept / 3600 * rate.on_demand * rate.nodes
    return {"cost_usd": round(sum(paid / 3600 * r.hourly for paid, r in paid_at), 6),
            "on_demand_kept_usd": round(on_demand, 6) if on_demand is not None else None}
