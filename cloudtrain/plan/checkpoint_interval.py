"""``checkpoint.interval: auto``: the interval that keeps the most of a job's paid time as kept training.

Each checkpoint blocks training for a moment (C seconds); each interruption (a spot reclaim, a node failure) loses
the work since the last checkpoint, on average half an interval, plus the restart. Young's rule (refined by Daly)
puts the interval that minimises the sum at about ``sqrt(2 x C x M)``, M being the mean time between interruptions
of the whole job (any node's interruption stops it). C and M come from what the ended runs of the same job measured
on the same provider, machine type, node count and capacity (cloudtrain/home/measured.py: C from their checkpoint
events, M from their paid time per preemption), else from ``DEFAULT_COST`` and the assumptions below; a figure that
is not sound is never used. The result is held to ``[max(FLOOR, 2 x C), max_runtime]``, and the plan's note names the
bound where one set it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    ideal: float = 0.0  # sqrt(2 x C x M), before the bounds
    bound: str | None = None  # the bound that set ``seconds`` ("the 1m floor", "max_runtime (2h)"), None: none did
    runs: int = 0  # the earlier runs C and M were measured in
    where: str = ""  # what they ran on ("local, 1 node, spot")
    unsound: int = 0  # earlier runs of the job whose figures were not sound, not counted

    def _said(self) -> str:
        runs = f"{self.runs} earlier run{'s' if self.runs != 1 else ''} of the job" + \
            (f" ({self.where})" if self.where else "")
        said = {(True, True): f"both measured in {runs}",
                (True, False): f"the checkpoint cost measured in {runs}, the interruptions assumed",
                (False, True): f"the interruptions counted in {runs}, the checkpoint cost assumed",
                (False, False): "both assumed until runs of the job measure them"}[self.cost_measured,
                                                                                    self.between_measured]
        if self.unsound:
            said += (f"; {self.unsound} earlier run{'s' if self.unsound != 1 else ''} measured nothing sound "
                     "(not counted)")
        return said

    def _formula(self, per: str) -> str:
        held = f" = {format_duration(self.ideal)}, held to {self.bound}" if self.bound else ""
        return (f"Young/Daly: sqrt(2 x {self.cost:.0f}s {per} x {format_duration(self.between)} between "
                f"interruptions){held}")

    def note(self) -> str:
        return f"{NOTE_PREFIX} {format_duration(self.seconds)} ({self._formula('blocked per checkpoint')}), " \
               f"{self._said()}"

    def stack_note(self) -> str:
        """For a job whose stack saves into checkpoint.dir on its own schedule: no interval is announced (nothing
        cloudtrain sets would change when the stack saves), only the one to set there."""
        return (f"{NOTE_PREFIX} the script's own stack decides when it saves (checkpoint.dir), so cloudtrain sets no "
                f"interval; the one that keeps the most training is about {format_duration(self.seconds)} "
                f"({self._formula('per save')}; the cost of a save is measured from its files): set it in the stack "
                "(save_steps, every_n_train_steps, eval_interval ...)")


def _usable(value: float | None) -> float | None:
    """A measured C or M the rule can use (finite, not negative, at most ten years), else None: assumed."""
    from cloudtrain.home.measured import MAX_PAID_S

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= MAX_PAID_S else None


def bounded(cost: float, between: float, max_runtime: int) -> tuple[int, float, str | None]:
    """The interval in seconds for ``cost`` seconds blocked per checkpoint and ``between`` seconds between
    interruptions, within ``[max(FLOOR, 2 x cost), max_runtime]``; the ideal before the bounds; the bound that set
    it (None: the ideal itself)."""
    ideal = math.sqrt(2.0 * cost * between)
    low = max(float(FLOOR), 2.0 * cost)
    if ideal > max_runtime or low > max_runtime:
        return max(1, int(max_runtime)), ideal, f"max_runtime ({format_duration(max_runtime)})"
    if ideal >= low:
        return int(ideal), ideal, None
    return int(low), ideal, (f"the {format_duration(FLOOR)} floor" if low == FLOOR else
                             f"twice the checkpoint cost ({format_duration(low)})")


def choose(cost: float, between: float, max_runtime: int) -> int:
    """The interval in seconds (``bounded``'s), for what is known; anything not a usable figure is assumed."""
    c, m = _usable(cost), _usable(between)
    return bounded(DEFAULT_COST if c is None else c, ON_DEMAND_NODE_HOURS * 3600.0 if m is None else m,
                   max_runtime)[0]


def auto_interval(*, spot: bool, nodes: int, max_runtime: int, cost: float | None = None,
                  between: float | None = None, runs: int = 0, where: str = "", unsound: int = 0) -> Interval:
    """The interval for a job of ``nodes`` nodes; ``cost`` and ``between`` where earlier runs (``runs`` of them, on
    ``where``) measured them. A figure that is not finite, is negative or past ten years is not used: assumed."""
    per_node = (SPOT_NODE_HOURS if spot else ON_DEMAND_NODE_HOURS) * 3600.0
    cost, between = _usable(cost), _usable(between)
    c = cost if cost is not None else DEFAULT_COST
    m = between if between is not None else per_node / max(nodes, 1)
    seconds, ideal, bound = bounded(c, m, max_runtime)
    return Interval(seconds, c, m, cost is not None and between is not None, cost is not None, between is not None,
                    ideal, bound, runs, where, unsound)


def measured_key(plan: Any) -> dict[str, Any]:
    """What a run of ``plan`` measures, as its ``submitted`` event records it and the next plan looks it up
    (cloudtrain/home/measured.py): the provider, machine type, node count, spot or not, and the job's name."""
    machine = getattr(plan.machine, "instance_type", None)
    return {"provider": plan.provider, "machine": machine if isinstance(machine, str) else None,
            "nodes": plan.spec.nodes, "spot": bool(plan.spec.spot), "name": str(plan.spec.name)}


def learned(plan: Any) -> Interval:
    """``auto``'s interval for ``plan`` (its spec still says ``auto``), from what the ended runs of the same job on
    the same provider, machine type, node count and capacity measured (cloudtrain/home/measured.py), else from the
    assumptions above."""
    from cloudtrain.home import measured

    key = measured_key(plan)
    found = measured.read(key)
    spec = plan.spec
    where = f"{key['provider']}{', ' + key['machine'] if key['machine'] else ''}, {key['nodes']} " \
            f"node{'s' if key['nodes'] != 1 else ''}{', spot' if key['spot'] else ''}"
    return auto_interval(spot=spec.spot, nodes=spec.nodes, max_runtime=spec.max_runtime, cost=found.cost,
                         between=found.between, runs=found.runs, where=where, unsound=found.unsound)


def submitted_fields(spec: Any, notes: list[str]) -> dict[str, Any]:
    """What the job's ``submitted`` event says of its checkpoint interval, for `status` to show the one the job runs
    with: the seconds, and why (``auto``'s reasoning from the plan's note, or the spec's own value)."""
    seconds = spec.checkpoint.interval
    if not isinstance(seconds, int):
        return {}
    why = next((n[len(NOTE_PREFIX):].strip() for n in notes if n.startswith(NOTE_PREFIX)), None)
    return {"checkpoint_interval_s": seconds, "checkpoint_interval_from": f"auto: {why}" if why else "the spec"}
