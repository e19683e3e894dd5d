"""What a timeline event may say, and who may say it: the screen every event passes before a figure is made of it.

A job's events come from three places (cloudtrain/home/timeline.py), trusted differently:
- **the home's own file**, written by this client and the local supervisor: the legs' facts (``submitted``,
  ``state``, ``ended``, ``restarted``, ``preempted``, the supervisor's ``node_started`` with its ``attempt``);
- **a node's own lines** in its log (the bootstrap's: ``node_started`` with its rank, ``restored``, ``spot_notice``,
  the checkpoints node 0 publishes of a stack's folder, ``checkpoint_dir_empty``);
- **a worker's lines** (``[default<r>]:`` before the event: the training script's process, which prints whatever it
  likes): only the kinds cloudtrain's runtime emits there (``step``, the Checkpointer's ``checkpoint``,
  ``training_again``), and only within what a worker can claim.

Each kind has a schema (cloudtrain/home/event_models.py, pydantic): types (``true`` is not a step), finite numbers,
non-negative durations and counts, and every event's ``t`` inside the job's life (submitted .. ended, plus
``SKEW_S`` for a node's clock). A step that goes back without a restart or restore between is refused too. An event
that fails is dropped and counted by kind and reason, never a traceback, never a figure.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

SKEW_S = 300.0  # how far a node's clock may be from this machine's before its events fall outside the job's life
WORKER_KINDS = frozenset({"step", "checkpoint", "training_again"})
CLIENT_KINDS = frozenset({"submitted", "staged", "state", "ended", "restarted", "moved", "preempted"})
RESETS = frozenset({"node_started", "restored", "training_again", "preempted", "restarted", "state", "submitted"})
STEP_CARRIERS = frozenset({"step", "checkpoint", "training_again", "restored"})


def _refusal(event: dict[str, Any], source: str) -> str | None:
    """Why an event may not be taken from ``source`` ("home", "node" or "worker"), or None."""
    kind = event.get("e")
    if source == "worker" and kind not in WORKER_KINDS:
        return "not a kind a worker's runtime emits"
    if source != "home" and (kind in CLIENT_KINDS or "attempt" in event):
        return "only the platform (this client, the local supervisor) says that"
    from pydantic import ValidationError  # here, not at import: `wait` and `list` poll without screening

    from cloudtrain.home.event_models import model_of

    try:
        model_of(str(kind)).model_validate(event)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'event'}: {first['msg'].lower()}"
    return None


def life(own: list[dict[str, Any]], now: float | None = None) -> tuple[float | None, float]:
    """The job's life on this machine's clock: (submitted, ended or now), from the home's own events."""
    times = [float(e["t"]) for e in own if e.get("e") == "submitted" and _finite(e.get("t"))]
    ended = [float(e["ended_at"] if _finite(e.get("ended_at")) else e["t"]) for e in own
             if e.get("e") == "ended" and _finite(e.get("t"))]
    return (min(times) if times else None), (max(ended) if ended else (time.time() if now is None else now))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def screen(own: list[dict[str, Any]], found: list[dict[str, Any]], now: float | None = None
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events that pass, by time, and what was refused: ``{"count": n, "kinds": {"<kind>: <why>": n}}``.
    ``own``: the home's file; ``found``: the nodes' logs' (each tagged ``by``: "node" or "worker")."""
    refused: Counter[str] = Counter()
    born, end = life(own, now)
    low = None if born is None else born - SKEW_S
    high = end + SKEW_S
    kept = []
    for source, events in (("home", own), (None, found)):
        for event in events:
            why = _refusal(event, source or str(event.get("by")))
            if why is None and ((low is not None and event["t"] < low) or event["t"] > high):
                why = "dated outside the job's life (a node's clock off by more than 5 minutes, or a forged line)"
            if why is None:
                kept.append(event)
            else:
                refused[f"{str(event.get('e'))[:40]}: {why}"] += 1
    kept.sort(key=lambda e: e["t"])
    kept = _steps_forward(kept, refused)
    return kept, {"count": sum(refused.values()), "kinds": dict(refused.most_common(20))}


def _steps_forward(events: list[dict[str, Any]], refused: Counter[str]) -> list[dict[str, Any]]:
    """Drop a step that goes back (100, then 10) with no restart or restore between: a rate of -90 steps/s is not a
    rate. Each kind keeps its own order (a checkpoint is announced once published, after later steps' reports)."""
    out: list[dict[str, Any]] = []
    high: dict[str, int] = {}
    for event in events:
        kind, step = event["e"], event.get("step")
        if kind in RESETS and (event.get("by") != "worker" or kind == "training_again"):
            high = {}
        if kind in STEP_CARRIERS and isinstance(step, int):
            if step < high.get(kind, -1):
                refused[f"{kind}: the step went back with no restart or restore between"] += 1
                continue
            high[kind] = step
        out.append(event)
    return out


def said(ignored: dict[str, Any]) -> str | None:
    """One line for `status` naming what was refused, or None."""
    if not ignored.get("count"):
        return None
    kinds = "; ".join(f"{why} ({n})" for why, n in ignored["kinds"].items())
    return f"timeline: {ignored['count']} event line(s) ignored: {kinds[:600]}"
