"""``checkpoint.interval: auto``: the interval that keeps the most of a job's paid time as kept training.

Each checkpoint blocks training for a moment (C seconds); each interruption (a spot reclaim, a node failure) loses
the work since the last checkpoint, on average half an interval, plus the restart. Young's rule (refined by Daly)
puts the interval that minimises the sum at about ``sqrt(2 x C x M)``, M being the mean time between interruptions
of the whole job (any node's interruption stops it). C comes from the job's earlier runs where the home measured it
(the timeline's checkpoint events), else ``DEFAULT_COST``; M from the interruptions counted in earlier runs, else
the assumptions below. The result is held to ``[max(FLOOR, 2 x C), max_runtime]``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.node.durations import format_duration

AUTO = "auto"
NOTE_PREFIX = "checkpoint.interval auto:"  # how the plan's note on the chosen interval begins
FLOOR = 60  # seconds: a checkpoint a minute at the most, whatever the numbers say
DEFAULT_COST = 30.0  # seconds training is blocked per checkpoint, until a run of the job measured it
# Mean hours between interruptions of one node, assumed until earlier runs counted them: a spot node is reclaimed
# every few hours at the busy end of the clouds' published interruption ranges (AWS's Spot Instance Advisor buckets
# "<5%" to ">20%" a month; GCP and Azure give no figure), an on-demand node fails about once a month.
SPOT_NODE_HOURS = 6.0
ON_DEMAND_NODE_HOURS = 30 * 24.0


@dataclass(frozen=True)
class Interval:
    seconds: int
    cost: float  # C: seconds blocked per checkpoint
    between: float  # M: mean seconds between the job's interruptions
    measured: bool  # C and M from earlier runs (else the assumptions above)
    cost_measured: bool = False
    between_measured: bool = False

    def note(self) -> str:
        said = {(True, True): "both measured in earlier runs of the job",
                (True, False): "the checkpoint cost measured in earlier runs, the interruptions assumed",
                (False, True): "the interruptions counted in earlier runs, the checkpoint cost assumed",
                (False, False): "both assumed until runs of the job measure them"}
        return (f"{NOTE_PREFIX} {format_duration(self.seconds)} (Young/Daly: sqrt(2 x "
                f"{self.cost:.0f}s blocked per checkpoint x {format_duration(self.between)} between "
                f"interruptions), {said[self.cost_measured, self.between_measured]}")

    def stack_note(self) -> str:
        """For a job whose stack saves into checkpoint.dir on its own schedule: no interval is announced (nothing
        cloudtrain sets would change when the stack saves), only the one to set there."""
        return (f"{NOTE_PREFIX} the script's own stack decides when it saves (checkpoint.dir), so cloudtrain sets no "
                f"interval; the one that keeps the most training is about {format_duration(self.seconds)} "
                f"(Young/Daly: sqrt(2 x {self.cost:.0f}s per save x {format_duration(self.between)} between "
                "interruptions; the cost of a save is measured from its files): set it in the stack (save_steps, "
                "every_n_train_steps, eval_interval ...)")


def choose(cost: float, between: float, max_runtime: int) -> int:
    """The interval in seconds for ``cost`` seconds blocked per checkpoint and ``between`` seconds between
    interruptions, within ``[max(FLOOR, 2 x cost), max_runtime]``."""
    ideal = math.sqrt(2.0 * max(cost, 0.0) * max(between, 0.0))
    return int(max(1, min(max(ideal, FLOOR, 2.0 * cost), max_runtime)))


def auto_interval(*, spot: bool, nodes: int, max_runtime: int, cost: float | None = None,
                  between: float | None = None) -> Interval:
    """The interval for a job of ``nodes`` nodes; ``cost`` and ``between`` where earlier runs measured them."""
    per_node = (SPOT_NODE_HOURS if spot else ON_DEMAND_NODE_HOURS) * 3600.0
    c = cost if cost is not None else DEFAULT_COST
    m = between if between is not None else per_node / max(nodes, 1)
    return Interval(choose(c, m, max_runtime), c, m, cost is not None and between is not None, cost is not None,
                    between is not None)


def submitted_fields(spec: Any, notes: list[str]) -> dict[str, Any]:
    """What the job's ``submitted`` event says of its checkpoint interval, for `status` to show the one the job runs
    with: the seconds, and why (``auto``'s reasoning from the plan's note, or the spec's own value)."""
    seconds = spec.checkpoint.interval
    if not isinstance(seconds, int):
        return {}
    why = next((n[len(NOTE_PREFIX):].strip() for n in notes if n.startswith(NOTE_PREFIX)), None)
    return {"checkpoint_interval_s": seconds, "checkpoint_interval_from": f"auto: {why}" if why else "the spec"}


# -- what earlier runs measured: kept per job name in the home, from the goodput `status` works out --------------

_STAMP = re.compile(r"(-\d{8}-\d{6}-[0-9a-f]{4})?(-r\d+)?$")


def _file(name: str) -> Path:
    from cloudtrain.home.paths import cloudtrain_home

    return cloudtrain_home() / "measured" / f"{name}.json"


def remember(job_id: str, goodput: dict[str, Any]) -> None:
    """What one job's run measured (checkpoints and the time they blocked, paid time, preemptions), under its name,
    for the next plan of ``interval: auto``. Best effort: a home that cannot take it only means the next plan
    assumes."""
    name = _STAMP.sub("", job_id) or job_id
    figures = {k: goodput.get(k) for k in ("checkpoints", "paid_s", "preemptions")}
    figures["blocked_s"] = (goodput.get("losses_s") or {}).get("checkpoints")
    if not all(isinstance(v, (int, float)) for v in figures.values()):
        return
    with contextlib.suppress(OSError, ValueError):
        path = _file(name)
        known = json.loads(path.read_text()) if path.exists() else {}
        known = known if isinstance(known, dict) else {}
        if known.get(job_id) == figures:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**known, job_id: figures}))
        os.replace(tmp, path)


def measured(name: str) -> tuple[float | None, float | None]:
    """(seconds blocked per checkpoint, mean seconds between interruptions) over the earlier runs of jobs of this
    name, each None where none measured it (no checkpoint; no interruption yet)."""
    try:
        known = json.loads(_file(name).read_text())
    except (OSError, ValueError):
        return None, None
    rows = [r for r in known.values() if isinstance(r, dict)] if isinstance(known, dict) else []
    total = {k: sum(float(r.get(k) or 0) for r in rows if isinstance(r.get(k), (int, float)))
             for k in ("checkpoints", "blocked_s", "paid_s", "preemptions")}
    cost = total["blocked_s"] / total["checkpoints"] if total["checkpoints"] > 0 else None
    between = total["paid_s"] / total["preemptions"] if total["preemptions"] > 0 else None
    return cost, between
