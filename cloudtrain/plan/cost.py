"""The cost model: what a job has cost so far at list prices, leg by leg, and what a budget (``max_cost``) buys.

A *leg* is one submission of a job (the first, or a resubmission after preemption, on any provider); it is billed
from the time it started until it ended (or now) for its nodes at its *rate*: the per-node-hour list price of its
machine, spot or on-demand as it ran. The API, for anything that runs legs (recovery, fallback across providers)::

    rate = rate_of(plan)                       # a Rate, from the plan's estimate (None: no price known)
    total = accrued([Leg("aws://...", started_at, ended_at, rate), ...], now=time.time())
    total.cost, total.on_demand, total.savings, total.legs   # USD; per leg: hours and cost

Each submitted job's rate (and its budget) is remembered under the cloudtrain home (``remember``), so
``cloudtrain cost HANDLE`` and the watcher (cloudtrain/jobs/budget.py) price a chain of legs without the plan. List
prices only: an estimate to act on, never a bill (no storage, egress, logging or discounts).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain import safe_json
from cloudtrain.errors import SpecError
from cloudtrain.home.paths import cloudtrain_home

if TYPE_CHECKING:
    from cloudtrain.plan.model import Plan

clock = time.time  # what a running leg is priced until (tests move it instead of waiting an hour)
BACKSTOP_MARGIN = 30  # seconds, at least, past what max_cost buys before the platform's max_runtime stops the job


@dataclass(frozen=True)
class Rate:
    """How one leg is billed: per node-hour list prices of its machine, and which of them applies."""

    provider: str
    instance_type: str
    nodes: int
    capacity: str  # "on_demand", "spot" or "flex_start" (billed at most on-demand)
    on_demand: float | None  # USD per node-hour
    spot: float | None = None  # USD per node-hour; None: not published (billed as on-demand, the upper bound)
    source: str = "catalog"  # where the price comes from ("catalog", "providers.local.price_per_node_hour")

    @property
    def per_node_hour(self) -> float | None:
        """The price this leg is billed at: spot where it ran on spot and spot has a price, else on-demand."""
        return self.spot if self.capacity == "spot" and self.spot is not None else self.on_demand

    @property
    def hourly(self) -> float | None:
        """USD per hour for all of the leg's nodes."""
        price = self.per_node_hour
        return None if price is None else price * self.nodes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Leg:
    """One submission: when it ran and at what rate (None: no price known for it)."""

    handle: str
    started_at: float | None  # None: not started yet (nothing billed)
    ended_at: float | None  # None: still running (billed until now)
    rate: Rate | None
    state: str = ""
    restarts: int = 0  # the platform's own restarts within this leg (SageMaker spot, a local job)


@dataclass(frozen=True)
class LegCost:
    leg: Leg
    hours: float  # wall hours billed (per node)
    cost: float | None  # USD at the rate it ran; None: no price
    on_demand: float | None  # USD had it run on-demand

    def to_dict(self) -> dict[str, Any]:
        leg = self.leg
        return {"handle": leg.handle, "state": leg.state, "started_at": leg.started_at, "ended_at": leg.ended_at,
                "restarts": leg.restarts, "hours": round(self.hours, 4),
                "nodes": leg.rate.nodes if leg.rate else None,
                "instance_type": leg.rate.instance_type if leg.rate else None,
                "capacity": leg.rate.capacity if leg.rate else None,
                "per_node_hour": leg.rate.per_node_hour if leg.rate else None,
                "cost": _usd(self.cost), "on_demand_cost": _usd(self.on_demand)}


@dataclass(frozen=True)
class Accrued:
    """The cost of a chain of legs so far."""

    legs: list[LegCost] = field(default_factory=list)

    @property
    def cost(self) -> float:
        """USD at the rates the legs ran (legs without a price count 0: see ``unpriced``)."""
        return sum(c.cost or 0.0 for c in self.legs)

    @property
    def on_demand(self) -> float:
        return sum(c.on_demand if c.on_demand is not None else (c.cost or 0.0) for c in self.legs)

    @property
    def savings(self) -> float:
        """What spot saved against on-demand list prices."""
        return self.on_demand - self.cost

    @property
    def hours(self) -> float:
        return sum(c.hours for c in self.legs)

    @property
    def restarts(self) -> int:
        """Resubmissions (legs after the first) plus the platforms' own restarts within legs."""
        return max(0, len(self.legs) - 1) + sum(c.leg.restarts for c in self.legs)

    @property
    def unpriced(self) -> list[str]:
        return [c.leg.handle for c in self.legs if c.cost is None]

    def to_dict(self) -> dict[str, Any]:
        return {"currency": "USD", "cost": _usd(self.cost), "on_demand_cost": _usd(self.on_demand),
                "spot_savings": _usd(self.savings), "hours": round(self.hours, 4), "restarts": self.restarts,
                "legs": [c.to_dict() for c in self.legs], "unpriced": self.unpriced,
                "basis": "list prices x nodes x wall time per leg: an estimate, compute only, never a bill"}


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def leg_cost(leg: Leg, now: float | None = None) -> LegCost:
    if leg.started_at is None:
        hours = 0.0
    else:
        end = leg.ended_at if leg.ended_at is not None else (clock() if now is None else now)
        hours = max(0.0, end - leg.started_at) / 3600
    rate = leg.rate
    if rate is None or rate.hourly is None:
        return LegCost(leg, hours, None, None)
    on_demand = None if rate.on_demand is None else rate.on_demand * rate.nodes * hours
    return LegCost(leg, hours, rate.hourly * hours, on_demand)


def accrued(legs: Iterable[Leg], now: float | None = None) -> Accrued:
    """The cost of ``legs`` until ``now`` (default: the clock): each leg's wall time x nodes x its billed rate."""
    return Accrued([leg_cost(leg, now) for leg in legs])


# -- a plan's rate and budget ----------------------------------------------------------------------------------

def rate_of(plan: Plan) -> Rate | None:
    """The plan's rate: the catalog's list prices (its estimate), else a price the provider's options give
    (``providers.local.price_per_node_hour``); None: no price known."""
    spec = plan.spec
    est = plan.estimate or {}
    if est.get("available"):
        spot = est.get("spot") or {}
        return Rate(plan.provider, est["instance_type"], spec.nodes, est["billed_as"],
                    est["on_demand"]["per_node_hour"], spot.get("per_node_hour"))
    price = getattr(spec.providers.held(plan.provider), "price_per_node_hour", None)
    if price is None:
        return None
    return Rate(plan.provider, plan.machine.instance_type if plan.machine else "this machine", spec.nodes,
                "spot" if spec.spot else "on_demand", price, price if spec.spot else None,
                source=f"providers.{plan.provider}.price_per_node_hour")


def plan_budget(plan: Plan) -> dict[str, Any] | None:
    """What the plan's ``max_cost`` buys (hours at on-demand and at spot prices for this job's nodes), or None
    without one. A budget no price backs, or below one hour of a list price, is refused (SpecError, exit 2)."""
    budget = plan.spec.max_cost
    if budget is None:
        return None
    rate = rate_of(plan)
    if rate is None or not rate.hourly:  # None, or a catalog's 0: nothing to divide the budget by
        why = (plan.estimate or {}).get("reason") or f"{plan.provider} has no list prices in cloudtrain's catalog"
        extra = " (or set providers.local.price_per_node_hour to rehearse one)" if plan.provider == "local" else ""
        raise SpecError(f"cannot hold a budget without a price: {why}", field="max_cost",
                        remedy=f"pick a machine the catalog prices (`cloudtrain catalog`){extra}, or leave max_cost "
                               "out")
    hourly = rate.hourly
    if rate.source == "catalog" and budget < hourly:
        raise SpecError(f"${budget:,.2f} buys less than one hour of this job: {rate.nodes} x {rate.instance_type} "
                        f"cost ${hourly:,.2f}/h ({rate.capacity.replace('_', '-')} list price)", field="max_cost",
                        remedy=f"raise max_cost to at least {hourly:.2f}, use fewer nodes or spot, or leave it out")

    def buys(per_node: float | None) -> float | None:
        return None if per_node is None else round(budget / (per_node * rate.nodes), 3)

    return {"max_cost": budget, "currency": "USD", "billed_as": rate.capacity, "hourly": _price(hourly),
            "hours": round(budget / hourly, 3), "on_demand_hours": buys(rate.on_demand),
            "spot_hours": buys(rate.spot), "price_source": rate.source,
            "enforced_by": "the watcher: a foreground submit, `cloudtrain wait --recover` or Run.wait(recover=True) "
                           "stops the job with a final checkpoint when the cost accrued reaches max_cost; without "
                           "one, the platform's max_runtime (runtime_cap)"}


def _price(value: float) -> float:
    """A price as shown: 4 decimals, or 4 significant digits where those round it to 0 (a rehearsal's $0.00001)."""
    return round(value, 4) or float(f"{value:.4g}")


def runtime_cap(plan: Plan) -> int | None:
    """The max_runtime that makes the platform itself hold the plan's budget when nothing watches the job (a
    detached submit, a closed laptop): the time it buys plus a margin in which a watcher, where one runs, stops the
    job first (1 %, at least BACKSTOP_MARGIN seconds). None where max_runtime is already that short. From the rate
    itself, never from the plan's rounded figures (a tiny price rounds to 0)."""
    rate, budget = rate_of(plan), plan.spec.max_cost
    if rate is None or not rate.hourly or budget is None:
        return None
    bought = budget / rate.hourly * 3600
    if bought >= plan.spec.max_runtime:
        return None
    cap = math.ceil(bought + max(BACKSTOP_MARGIN, bought / 100))
    return cap if cap < plan.spec.max_runtime else None


# -- what each submitted job costs, remembered here ------------------------------------------------------------

def _path(handle: str) -> Path:
    return cloudtrain_home() / "costs" / (re.sub(r"[^A-Za-z0-9._-]+", "_", handle) + ".json")


def remember(handle: str, plan: Plan) -> None:
    """Record a submitted job's rate and budget (nothing for a job with neither). Best effort: the job runs either
    way, and a home that cannot be written only loses `cloudtrain cost` for it."""
    rate = rate_of(plan)
    if rate is None and plan.spec.max_cost is None:
        return
    write(handle, {"handle": handle, "rate": rate.to_dict() if rate else None, "max_cost": plan.spec.max_cost})


def write(handle: str, record: dict[str, Any]) -> None:
    from cloudtrain.storage.local import atomic_write

    text = json.dumps(record, indent=1).encode()
    try:
        atomic_write(_path(handle), lambda out: out.write(text))
    except OSError as exc:
        import sys

        print(f"cloudtrain: warning: cannot record the price of {handle} ({exc}): `cloudtrain cost` will not know "
              "it", file=sys.stderr)


def recorded(handle: str) -> dict[str, Any] | None:
    """What was remembered of ``handle`` at submit, or None. A record of another shape (another version's, one
    edited by hand) is not used: said once on stderr, naming the file, what is wrong and the fix."""
    data, problem = _read(handle)
    if problem and problem not in _said:
        import sys

        _said.add(problem)
        print(f"cloudtrain: warning: {problem}", file=sys.stderr)
    return data


def problem(handle: str) -> str | None:
    """What is wrong with ``handle``'s cost record, with the fix; None when it is usable or there is none."""
    return _read(handle)[1]


_said: set[str] = set()
_RATE_TEXT = ("provider", "instance_type", "capacity", "source")
_RATE_NEEDS = ("provider", "instance_type", "nodes", "capacity", "on_demand")


def _read(handle: str) -> tuple[dict[str, Any] | None, str | None]:
    path = _path(handle)
    wrong: str | None
    try:  # safe_json: a FIFO in its place, one nested 100,000 deep or of a gigabyte is named like one not JSON
        data = safe_json.load(path, "it")
    except FileNotFoundError:
        return None, None
    except safe_json.UnreadableJson as exc:  # "it is not valid JSON (...)", "cannot read it: Permission denied"
        said = exc.message
        wrong = said[len("it "):] if said.startswith("it ") else "cannot be read" + said[len("cannot read it"):]
    else:
        wrong = _wrong(data)
        if wrong is None:
            return data, None
    return None, (f"the cost record {path} {wrong} (another version's, or edited): its price and budget are not "
                  f"used (the leg counts as unpriced)\n  fix: delete {path}, or restore it as `cloudtrain submit` "
                  "wrote it")


def _number(value: Any, least: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and least <= value < math.inf


def _wrong(data: Any) -> str | None:
    """What is wrong with a cost record's shape, or None (keys a later version adds are left alone)."""
    if not isinstance(data, dict):
        return f"holds a JSON {type(data).__name__}, not an object"
    if data.get("max_cost") is not None and not (_number(data["max_cost"], 0) and data["max_cost"] > 0):
        return f"has max_cost {data['max_cost']!r}, not an amount in USD"
    if data.get("stopped") is not None and not isinstance(data["stopped"], str):
        return f"has stopped {data['stopped']!r}, not text"
    rate = data.get("rate")
    if rate is None:
        return None
    if not isinstance(rate, dict):
        return f"has rate {rate!r}, not an object"
    missing = [key for key in _RATE_NEEDS if key not in rate]
    if missing:
        return f"has a rate without {', '.join(missing)}"
    for key in _RATE_TEXT:
        if key in rate and not isinstance(rate[key], str):
            return f"has rate.{key} {rate[key]!r}, not text"
    if not (_number(rate["nodes"], 1) and isinstance(rate["nodes"], int)):
        return f"has rate.nodes {rate['nodes']!r}, not a count of nodes"
    for key in ("on_demand", "spot"):
        if rate.get(key) is not None and not _number(rate[key], 0):
            return f"has rate.{key} {rate[key]!r}, not a price in USD"
    return None


def rate_from(record: dict[str, Any] | None) -> Rate | None:
    """The rate in a record ``recorded`` returned (its shape checked there)."""
    raw = (record or {}).get("rate")
    if not isinstance(raw, dict):
        return None
    known = {f.name for f in fields(Rate)}
    return Rate(**{key: value for key, value in raw.items() if key in known})
