"""``checkpoint.interval: auto``: the interval that keeps the most of a job's paid time as kept training.

Each checkpoint blocks training for a moment (C seconds); each interruption (a spot reclaim, a node failure) loses
the work since the last checkpoint, on average half an interval, plus the restart. Young's rule (refined by Daly)
puts the interval that minimises the sum at about ``sqrt(2 x C x M)``, M being the mean time between interruptions
of the whole job (any node's interruption stops it). C comes from the job's earlier runs where the home measured it
(the timeline's checkpoint events), else ``DEFAULT_COST``; M from the interruptions counted in earlier runs, else
the assumptions below. The result is held to ``[max(FLOOR, 2 x C), max_runtime]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cloudtrain.node.durations import format_duration

AUTO = "auto"
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

    def note(self) -> str:
        source = "both measured in earlier runs" if self.measured else \
            "both assumed until runs of the job measure them"
        return (f"checkpoint.interval auto: {format_duration(self.seconds)} (Young/Daly: sqrt(2 x "
                f"{self.cost:.0f}s blocked per checkpoint x {format_duration(self.between)} between "
                f"interruptions), {source}")


def choose(cost: float, between: float, max_runtime: int) -> int:
    """The interval in seconds for ``cost`` seconds blocked per checkpoint and ``between`` seconds between
    interruptions, within ``[max(FLOOR, 2 x cost), max_runtime]``."""
    ideal = math.sqrt(2.0 * max(cost, 0.0) * max(between, 0.0))
    return int(max(1, min(max(ideal, FLOOR, 2.0 * cost), max_runtime)))


def auto_interval(*, spot: bool, nodes: int, max_runtime: int, cost: float | None = None,
                  between: float | None = None) -> Interval:
    """The interval for a job of ``nodes`` nodes; ``cost`` and ``between`` where earlier runs measured them."""
    per_node = (SPOT_NODE_HOURS if spot else ON_DEMAND_NODE_HOURS) * 3600.0
    measured = cost is not None and between is not None
    c = cost if cost is not None else DEFAULT_COST
    m = between if between is not None else per_node / max(nodes, 1)
    return Interval(choose(c, m, max_runtime), c, m, measured)
